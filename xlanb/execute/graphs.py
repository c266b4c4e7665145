"""Whole graphs: compiled once per structure, kept in the graph cache and the graph log
(``xlanb.graphs()``), each with why it compiled and, for a recompile, what changed."""
from __future__ import annotations

import _thread
import functools
import hashlib
import re
import sys
import time
import types
import warnings
from dataclasses import dataclass, field

import jax

from ..base import metrics
from ..base.config import config
from ..base.frames import SourceLoc, format_loc
from ..base.session import session
from ..base.tables import format_bytes, format_table
from ..graph.collectives import CollectiveList, parse_collectives
from ..graph.explain import explain
from ..graph.render import render_dot, render_text
from ..graph.summary import summarize
from ..ir import GraphPlan, leaf_meta, stable_hash
from ..runtime import store
from ..runtime.jit import background, compile_lowered, jax_context, lower_jitted
from ..runtime.mesh import common_mesh, on_mesh, sharding_text
from .background import drain_lowerings, lowerings_waiting
from .compile import add_op_note, load_stored, scalar_spec, store_key, tensor_spec
from .memory import (GraphMemory, check_graph, device_oom, graph_buffers, graph_memory,
                     is_device_oom)
from .resident import admit_graph

@dataclass
class CompiledGraph:
    """One compiled graph, as ``xlanb.graphs()`` lists it."""
    hash: str
    device: int
    n_nodes: int
    n_inputs: int
    n_outputs: int
    cause: str
    src: SourceLoc | None  # the user's line whose sync compiled it
    compile_time: float
    # the executable while it is loaded (execute/resident.py may drop it; ``executable``
    # gets it back)
    _exe: object = field(repr=False)
    hits: int = 0
    run_time: float = 0.0
    explanation: str = ""  # why it compiled: how it differs from the last graph from here
    summary: object = field(default=None, repr=False)  # summary.GraphSummary
    lowered: object = field(default=None, repr=False)  # jax.stages.Lowered, once known
    # lowers the graph again (an executable loaded from the store was never lowered here)
    relower: object = field(default=None, repr=False)
    # a graph on a mesh: its leaves' shardings, its outputs' (the partitioner's choice)
    # and the collectives in its optimized module
    in_shardings: tuple | None = field(default=None, repr=False)
    out_shardings: tuple | None = field(default=None, repr=False)
    collectives: CollectiveList = field(default_factory=CollectiveList, repr=False)
    _memory: object = field(default=False, repr=False)  # False: not asked yet
    # its HLO module's name, as XLA's profiler trace names it (``hlo_module``)
    module: str = ""
    # gets a dropped executable back: from the executable store, or compiled again
    reload: object = field(default=None, repr=False)

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
        if self.reload is not None:
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
            self.lowered = self.relower()
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


class GraphList(list):
    """``xlanb.graphs()``: compiled graphs, oldest first, printable as a table."""

    _COLUMNS = ("#", "hash", "nodes", "in", "out", "compile", "hits", "run", "peak mem",
                "cause", "source")

    def rows(self) -> list[tuple]:
        return [(str(i), g.hash[:12], str(g.n_nodes), str(g.n_inputs), str(g.n_outputs),
                 f"{g.compile_time:.2f}s", str(g.hits), f"{g.run_time:.3f}s",
                 format_bytes(g.memory.peak_bytes) if g.memory else "?", g.cause,
                 format_loc(g.src))
                for i, g in enumerate(self)]

    def __str__(self) -> str:
        if not self:
            return "no compiled graphs"
        lines = format_table(self._COLUMNS, self.rows()).split("\n")
        for i, g in enumerate(self):
            if g.explanation:
                lines.append(f"  #{i} recompiled: {g.explanation}")
            if g.collectives:
                counts = ", ".join(f"{n} {k}" for k, n in g.collectives.counts().items())
                lines.append(f"  #{i} on a mesh: {counts}; {g.collectives.total_bytes} bytes "
                             "per device per run (xlanb.collectives)")
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        import html
        head = "".join(f"<th>{c}</th>" for c in self._COLUMNS + ("why",))
        body = "".join("<tr>" + "".join(f"<td>{html.escape(v)}</td>" for v in r)
                       + f"<td>{html.escape(g.explanation)}</td></tr>"
                       for r, g in zip(self.rows(), self))
        return f"<table class='xlanb-graphs'><tr>{head}</tr>{body}</table>"


_graph_cache = session.graph_cache
graph_log = session.graph_log  # in compile order


# Source-mapped HLO. JAX names each instruction by its source info: a traceback (the
# innermost frame outside JAX gives source_file/source_line) and a name stack (op_name).
# While an op is traced, xlanb sets both from the op's node: a traceback whose innermost
# frame is a synthetic code object with the user's file, line and function (one per
# SourceLoc, made once), and the scope path plus aten op as the name. Metadata only: the
# graph's key never sees it, so the same structure from another line hits the cache.
try:
    from jax._src import source_info_util as _siu
    _get_traceback = _siu.Traceback.get_traceback
    _siu_context = _siu._source_info_context
    from jax._src.lib.mlir import ir
except (ImportError, AttributeError):  # another JAX: no metadata, nothing else changes
    _siu = None


def _traceback_template(get, box, lock): box.append(get()); lock.release()  # noqa: E702


_tracebacks: dict = {}


def _user_traceback(src: SourceLoc):
    """A JAX traceback of one frame: ``src`` (made once per SourceLoc). Captured on a
    new thread, so no xlanb frame sits under it in the HLO's stack frames."""
    tb = _tracebacks.get(src)
    if tb is None:
        code = _traceback_template.__code__.replace(
            co_filename=src.file, co_firstlineno=src.line, co_name=src.function,
            co_qualname=src.function)
        box: list = []
        lock = _thread.allocate_lock()
        lock.acquire()
        _thread.start_new_thread(types.FunctionType(code, {}), (_get_traceback, box, lock))
        lock.acquire()
        tb = _tracebacks[src] = box[0]
    return tb


def op_path(info, scope: str) -> str:
    """``BertModel/encoder/layer/0/attention/self/query/aten::addmm``: HLO's op_name."""
    return f"{scope.replace('.', '/')}/{info.name}" if scope else info.name


def _trace_op(info, args, scalars, src, scope):
    """``info.fn`` traced with the user's line and scope as JAX's source info."""
    if _siu is None:
        return info.fn(args, scalars)
    prev = _siu_context.context
    try:
        tb = _user_traceback(src) if src is not None else prev.traceback
        _siu_context.context = prev.replace(traceback=tb,
                                            name_stack=prev.name_stack.extend(op_path(info, scope)))
    except Exception:  # JAX's internals moved: no metadata, nothing else changes
        return info.fn(args, scalars)
    try:
        return info.fn(args, scalars)
    finally:
        _siu_context.context = prev


_LOC_NAME = re.compile(r'loc\("([^"]*)"')


def annotate_op_types(lowered, names) -> None:
    """Give each instruction of ``lowered`` its aten op as HLO ``op_type``: an MLIR name
    location ``"aten::addmm:"`` around the one JAX made (XLA reads a trailing ``:`` as the
    op type; JAX sets its primitive there only for the few ops it does not cache). The
    aten op is the last segment of the op's name stack that is one of ``names``.
    In place, before compiling; metadata only."""
    if _siu is None:
        return
    try:
        module = lowered.compiler_ir("stablehlo")
        names = set(names)
        made: dict = {}

        def visit(op):
            loc = op.location
            text = str(loc)
            if text in made:
                new = made[text]
            else:
                new = None
                m = _LOC_NAME.match(text)
                if m is not None and not m.group(1).endswith(":"):
                    for seg in reversed(m.group(1).split("/")):
                        if seg in names:
                            new = ir.Location.name(f"{seg}:", childLoc=loc)
                            break
                made[text] = new
            if new is not None:
                op.location = new
            return ir.WalkResult.ADVANCE

        with module.context:
            module.operation.walk(visit)
    except Exception:  # JAX's or MLIR's internals moved: no op_type, nothing else changes
        return


def _lower_annotated(fn, specs, names, lower_metric: str):
    lowered = lower_jitted(fn, specs, lower_metric=lower_metric)
    annotate_op_types(lowered, names)
    return lowered


def module_name(graph_hash: str) -> str:
    """The HLO module name of the graph with ``graph_hash``: one per graph, so that
    XLA's profiler events (which name their module) find the graph they ran in."""
    return "jit_xlanb_graph_" + graph_hash[:16]


def _graph_fn(plan: GraphPlan, out_shardings=None, name: str = "run"):
    """The JAX function of ``plan``'s graph."""
    return _graph_fn_of(_recipe(plan), out_shardings, name)


def _recipe(plan: GraphPlan) -> tuple:
    """What the graph function is built from: the steps, the roots' positions, and where
    each op was recorded, to name the one whose lowering fails and to put in the HLO's
    metadata (not the nodes: a recipe lives as long as its graph's record, the nodes
    should not)."""
    return plan.steps, plan.root_pos, [(node.src, node.scope) for node in plan.op_nodes]


def _graph_fn_of(recipe: tuple, out_shardings=None, name: str = "run"):
    steps, root_pos, places = recipe

    def run(leaves, scalars):
        vals = list(leaves)
        k = 0
        for j, (info, ins) in enumerate(steps):
            n = len(info.scalar_specs)
            try:
                vals.append(_trace_op(info, [vals[i] for i in ins], scalars[k:k + n],
                                      *places[j]))
            except Exception as e:  # runs while tracing only: no cost in the executable
                add_op_note(e, "lowering failed in", info, *places[j])
                raise
            k += n
        if out_shardings is not None:  # SPMD: tensors updated in place stay where they were
            return [vals[p] if sh is None else jax.lax.with_sharding_constraint(vals[p], sh)
                    for p, sh in zip(root_pos, out_shardings)]
        return [vals[p] for p in root_pos]
    run.__name__ = run.__qualname__ = name  # jit names the module jit_<name>
    return run


def graph_specs(plan: GraphPlan, device: int, shardings=None, mesh=None):
    """The abstract arguments of ``plan``'s graph function: leaf arrays, lifted scalars.
    On a mesh, each leaf has its array's sharding (the graph's in_shardings) and the
    lifted scalars are replicated."""
    if shardings is None:
        return ([tensor_spec(leaf_meta(n), device) for n in plan.leaves],
                [scalar_spec(k, device) for info, _ in plan.steps for k in info.scalar_specs])
    return ([jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh)
             for s, sh in zip((tensor_spec(leaf_meta(n), device) for n in plan.leaves), shardings)],
            [jax.ShapeDtypeStruct(s.shape, s.dtype, weak_type=s.weak_type, sharding=mesh)
             for s in (scalar_spec(k, device) for info, _ in plan.steps for k in info.scalar_specs)])


def _sharding_of(a):
    return getattr(a, "sharding", None)


def mesh_leaves(plan: GraphPlan):
    """``(arrays, mesh)``: the leaves' arrays and, if the graph touches a sharded tensor
    (a sharded leaf or a ``mark_sharding`` constraint), its mesh, with every unsharded
    leaf replicated onto it (kept on the leaf, so the next step does not copy it again)."""
    arrays = [n.data for n in plan.leaves]
    if not session.spmd:
        return arrays, None
    mesh = common_mesh([_sharding_of(a) for a in arrays]
                       + [info.sharding for info, _ in plan.steps if info.sharding is not None])
    if mesh is None:
        return arrays, None
    for i, (n, a) in enumerate(zip(plan.leaves, arrays)):
        if not isinstance(a, tuple) and a.sharding.device_set != mesh.device_set:
            arrays[i] = n.data = on_mesh(a, mesh)
    return arrays, mesh


def lower_graph(plan: GraphPlan, device: int, arrays=None, mesh=None):
    """``plan`` lowered by JAX (a ``jax.stages.Lowered``), without compiling it (on
    ``mesh`` with the shardings of ``arrays``, as ``mesh_leaves`` gives them)."""
    shardings = tuple(_sharding_of(a) for a in arrays) if mesh is not None else None
    return _lower_graph_fn(_graph_fn(plan), graph_specs(plan, device, shardings, mesh),
                           _op_names(plan))


def _op_names(plan: GraphPlan) -> frozenset:
    return frozenset(info.name for info, _ in plan.steps)


def _relower(recipe: tuple, out_shardings, name: str, specs, names):
    """Lower a graph again from its recipe, through a function made for this lowering.
    A record keeps the recipe, not a function: JAX's tracing, lowering and compilation
    caches are keyed by the function, its jaxpr and its module (held weakly, up to 2,048
    each), so a function kept for every graph would keep each graph's executable loaded
    in those caches after xlanb dropped it."""
    return _lower_graph_fn(_graph_fn_of(recipe, out_shardings, name), specs, names)


def _lower_graph_fn(fn, specs, names=frozenset()):
    with jax_context():
        lowered = jax.jit(fn).lower(*specs)
    annotate_op_types(lowered, names)
    return lowered


def compiled_graph(plan: GraphPlan, device: int, cause: str, src,
                   arrays=None, mesh=None, keep=None) -> tuple[CompiledGraph, bool]:
    """The cached executable of ``plan``'s structure: from memory, else from the
    executable store, else compiled now. Returns it and whether it is new to this process.
    On a mesh (``mesh``, with the leaves' ``arrays``), the key holds the leaves'
    shardings too, and the executable is not stored."""
    shardings = tuple(_sharding_of(a) for a in arrays) if mesh is not None else None
    key = (device, plan.key) if shardings is None else (device, plan.key, shardings, keep)
    rec = _graph_cache.get(key)
    if rec is None:
        specs = graph_specs(plan, device, shardings, mesh)
        graph_hash = stable_hash(plan, device)
        if shardings is not None:
            graph_hash = hashlib.blake2b(
                (graph_hash + repr([sharding_text(s) for s in shardings])
                 + repr([s and sharding_text(s) for s in keep or ()])).encode(),
                digest_size=16).hexdigest()
        module = module_name(graph_hash)
        recipe = _recipe(plan)
        fn = _graph_fn_of(recipe, keep, module.removeprefix("jit_"))
        key_in_store = store_key(graph_hash.encode(), device, None) if shardings is None else None
        t0 = time.perf_counter()
        lowered = None
        exe = load_stored(key_in_store, device, "CompileTime")
        if exe is None:
            try:
                # runtime.jit.compile_jitted, with the op types put in between
                t_lower = time.perf_counter()
                lowered = _lower_annotated(fn, specs, _op_names(plan), "LowerTime")
                exe = _compile_graph(lowered, time.perf_counter() - t_lower)
            except Exception as e:
                e.add_note(f"xlanb: while compiling a graph of {len(plan.steps)} ops ({cause}) "
                           f"synced at {format_loc(src) or '?'}; every tensor keeps its "
                           "pending work (xlanb.pending_ir() shows it)")
                raise
            if key_in_store is not None:
                store.store(key_in_store, exe)
        metrics.counter("UncachedCompile")
        relower = functools.partial(_relower, recipe, keep, module.removeprefix("jit_"), specs,
                                    _op_names(plan))
        del fn  # see _relower
        summary = summarize(plan)
        prev = next((g for g in reversed(graph_log) if g.src == src and g.device == device), None)
        rec = CompiledGraph(graph_hash[:16], device, len(plan.steps), len(plan.leaves),
                            len(plan.roots), cause, src, time.perf_counter() - t0, exe,
                            explanation=explain(prev.summary, summary) if prev else "",
                            summary=summary, lowered=lowered,
                            relower=relower, module=module,
                            reload=functools.partial(_reload_graph, key_in_store, device,
                                                     relower))
        admit_graph(rec)
        if shardings is not None:
            rec.in_shardings = shardings
            try:
                rec.out_shardings = tuple(exe.output_shardings)
            except Exception:  # an executable that does not say (loaded, another JAX)
                rec.out_shardings = None
            if rec.out_shardings:  # the partitioner's choice for each output
                known = dict(summary.shardings)
                extra = tuple((p, "propagated " + sharding_text(sh))
                              for p, sh in zip(plan.root_pos, rec.out_shardings)
                              if p not in known and len(sh.device_set) > 1)
                rec.summary = summary._replace(shardings=summary.shardings + extra)
            rec.collectives = CollectiveList(
                parse_collectives(exe.as_text(), dict(mesh.mesh.shape)), rec.hash)
        _graph_cache[key] = rec
        graph_log.append(rec)
        return rec, True
    return rec, False


def _compile_graph(lowered, lower_s: float):
    """Compile a graph; single ops a look left unlowered (execute/prefix.py) are lowered
    meanwhile, on this thread, which would otherwise only wait."""
    if not lowerings_waiting():
        return compile_lowered(lowered, metric="CompileTime", lower_s=lower_s)
    future = background(compile_lowered, lowered, metric="CompileTime", lower_s=lower_s)
    drain_lowerings(future.done)
    return future.result()


def _reload_graph(key: str | None, device: int, relower):
    """A dropped graph executable: from the executable store, else compiled again."""
    exe = load_stored(key, device, "CompileTime")
    if exe is None:
        exe = compile_lowered(relower(), metric="CompileTime")
        if key is not None:
            store.store(key, exe)
    return exe


class RecompileWarning(UserWarning):
    """Graphs from one source line keep compiling (the graph is dynamic)."""


_syncs_at = session.syncs_at        # source location -> lazy syncs from there
_compiles_at = session.compiles_at  # source location -> new graphs from there
_warned_at = session.recompile_warned  # source locations already warned about


def _report_compile(rec: CompiledGraph, src) -> None:
    """XLANB_DEBUG printing, and the too-frequent warning that names the cause."""
    n = _compiles_at[rec.src] = _compiles_at.get(rec.src, 0) + 1
    if config.debug and rec.explanation:
        print(f"xlanb: new graph {rec.hash[:12]} ({rec.cause} at {format_loc(rec.src)}): "
              f"{rec.explanation}",
              file=sys.stderr)
    syncs = _syncs_at.get(rec.src, 0)
    if rec.explanation and n >= config.frequent_compiles and 2 * n >= syncs \
            and rec.src not in _warned_at:
        # Once per call site: each message differs (counts, shapes), so Python's own
        # once-per-text filter would let every later recompile through.
        _warned_at.add(rec.src)
        msg = (f"xlanb: compiles too frequent: {n} graphs in {syncs} syncs at "
               f"{format_loc(rec.src) or '?'} ({rec.cause}); latest: {rec.explanation}. "
               "Said once for this line; xlanb.graphs() lists every graph and why it "
               "compiled.")
        if src is not None:  # point the warning at the user's line, not at xlanb
            warnings.warn_explicit(msg, RecompileWarning, src.file, src.line)
        else:
            warnings.warn(msg, RecompileWarning, stacklevel=3)


def _kept(placed, mesh):
    """Where the graph should leave tensors it updates in place (``placed``: per root,
    the sharding of the value it replaces, or None), on ``mesh``: as sharded as they
    were, replicated if they were on one device. Otherwise the partitioner may shard an
    updated bias differently than it was, and the next step would compile again."""
    if mesh is None or placed is None:
        return None
    out = []
    for s in placed:
        if s is None:
            out.append(None)
        elif len(s.device_set) == 1:
            out.append(mesh)
        elif s.device_set == mesh.device_set:
            out.append(s)
        else:
            out.append(None)
    return tuple(out) if any(s is not None for s in out) else None


def find_graph(plan: GraphPlan, device: int, cause: str, src, placed=None):
    """``(CompiledGraph, fresh, leaf arrays)`` for ``plan``, as a sync would run it:
    on a mesh if it touches sharded tensors (``placed``: see ``_kept``)."""
    arrays, mesh = mesh_leaves(plan)
    rec, fresh = compiled_graph(plan, device, cause, src, arrays, mesh, _kept(placed, mesh))
    return rec, fresh, arrays


def run_graph(plan: GraphPlan, device: int, cause: str, src, placed=None) -> list:
    """Compile (or find) the graph of ``plan`` and run it; returns the roots' arrays.
    ``placed`` (SPMD): per root, the sharding of the value it replaces (see ``_kept``)."""
    _syncs_at[src] = _syncs_at.get(src, 0) + 1
    rec, fresh, arrays = find_graph(plan, device, cause, src, placed)
    if fresh:
        _report_compile(rec, src)
    else:
        metrics.counter("CachedCompile")
        rec.hits += 1
    # the graph's projected peak (and, with xlanb.memory_limit, the check) before it runs
    check_graph(rec, device, f"the graph of {len(plan.steps)} ops ({cause}) synced at "
                f"{format_loc(src) or '?'}")
    t0 = time.perf_counter()
    with jax.enable_x64(True):
        try:
            outs = rec.executable(arrays, plan.scalars)
            if lowerings_waiting():  # while the device runs it (execute/prefix.py)
                drain_lowerings(lambda: all(o.is_ready() for o in outs))
            jax.block_until_ready(outs)
        except Exception as e:
            if is_device_oom(e):
                raise device_oom(e, device, f"the graph {rec.hash[:12]} ({cause} at "
                                 f"{format_loc(src) or '?'})", rec) from e
            raise
    dt = time.perf_counter() - t0
    rec.run_time += dt
    metrics.record("ExecuteTime", dt)
    if rec.collectives:  # torch_xla has no name for these: xlanb's own
        metrics.counter("CollectiveOps", len(rec.collectives))
        metrics.counter("CollectiveBytes", rec.collectives.total_bytes)
    return outs


def graphs() -> GraphList:
    """Every compiled graph with its cause, source line, times, hits and explanation."""
    __debuggerskip__ = True  # IPython's debugger steps over xlanb frames
    return GraphList(graph_log)


def clear_graph_cache() -> None:
    session.resident_graphs.clear()
    _graph_cache.clear()
    graph_log.clear()
    _syncs_at.clear()
    _compiles_at.clear()
    _warned_at.clear()
