"""A graph's stages, as JAX's ``jax/_src/stages.py`` splits a function's: what a graph
computes (``GraphLowering``, made once per structure from a pending graph's plan), lowered
for a placement (``GraphLowering.lower``: xlanb's own devices; ``lower_for``: a TPU
target), then compiled (``execute/graphs.py`` for the CPU run, ``executables/target.py`` for
a target). The lowering keeps a recipe, not a function (see ``GraphLowering``), and puts
the user's lines and module scopes into the module's metadata.
"""
from __future__ import annotations

import _thread
import contextlib
import hashlib
import re
import sys
import types

import jax
from jax.sharding import SingleDeviceSharding

from ..base import metrics
from ..base.caches import cache
from ..base.config import config
from ..base.formats import HASH_ID, format_hash
from ..base.frames import SourceLoc
from ..graph.repeats import LOOP_OP, find_repeats
from ..graph.updates import PARAM_SEGMENT, param_modules
from ..ir.nodes import GraphPlan, leaf_meta, stable_hash
from ..runtime.devices import jax_device
from ..runtime.jit import jax_context, lower_jitted
from ..runtime.mesh import common_mesh, on_mesh, sharding_text
from ..runtime.targets import Target, retarget, retargeting
from ..base.session import session
from .compile import add_op_note, scalar_spec, tensor_spec

# Source-mapped HLO. JAX names each instruction by its source info: a traceback (the
# innermost frame outside JAX gives source_file/source_line) and a name stack (op_name).
# While an op is traced, xlanb sets both from the op's node: a traceback whose innermost
# frame is a synthetic code object with the user's file, line and function (one per
# SourceLoc, made once), and the scope path plus aten op as the name. Metadata only: the
# graph's key never sees it, so the same structure from another line hits the cache.
from jax.extend.mlir import ir

from ..runtime.jax_compat import locations_frame_limit, source_info

try:
    _get_traceback, _siu_context = source_info()
    _siu = True
except (ImportError, AttributeError):  # another JAX: no metadata, nothing else changes
    _siu = None


try:
    _frame_limit = locations_frame_limit()
except (ImportError, AttributeError):  # another JAX: full stacks, nothing else changes
    _frame_limit = None


def _one_frame():
    return _frame_limit(1) if _frame_limit is not None else contextlib.nullcontext()


def _traceback_template(get, box, lock): box.append(get()); lock.release()  # noqa: E702


_tracebacks = cache({}, "SourceLoc -> its one-frame JAX traceback")


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
        # An aten op's instructions mostly share one location, uniqued by MLIR (so ``==``
        # is a pointer comparison): the last one's answer is reused without printing the
        # location, which costs more than everything else here (a location holds the
        # user's whole call stack).
        last = [None, None]

        def visit(op):
            loc = op.location
            if last[0] is not None and loc == last[0]:
                new = last[1]
            else:
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
                last[0], last[1] = loc, new
            if new is not None:
                op.location = new
            return ir.WalkResult.ADVANCE

        with module.context:
            module.operation.walk(visit)
    except Exception:  # JAX's or MLIR's internals moved: no op_type, nothing else changes
        return



def module_name(graph_hash: str) -> str:
    """The HLO module name of the graph with ``graph_hash``: one per graph, so that
    XLA's profiler events (which name their module) find the graph they ran in."""
    return "jit_xlanb_graph_" + format_hash(graph_hash, HASH_ID)


def _named_places(steps, n_leaves: int, places) -> list:
    """``places`` for the lowering's names: an optimizer's op (no scope) is named after
    the module whose parameter it updates, under ``PARAM_SEGMENT`` (graph/updates.py),
    so that the compile profile can count it there. Metadata only."""
    params = param_modules(steps, n_leaves, places)
    if not params:
        return places
    return [(src, f"{PARAM_SEGMENT}.{params[j]}" if j in params else scope)
            for j, (src, scope) in enumerate(places)]


def _graph_fn_of(recipe: tuple, out_shardings=None, name: str = "run", repeats=None):
    steps, root_pos, places = recipe
    offsets = None
    named = None

    def run(leaves, scalars):
        nonlocal offsets, named
        if named is None:
            named = _named_places(steps, len(leaves), places)
        places_ = named
        if repeats is None:
            vals = list(leaves)
            k = 0
            for j, (info, ins) in enumerate(steps):
                n = len(info.scalar_specs)
                vals.append(_lower_op(info, [vals[i] for i in ins], scalars[k:k + n], places_[j]))
                k += n
        else:
            if offsets is None:
                offsets, k = [], 0
                for info, _ in steps:
                    offsets.append(k)
                    k += len(info.scalar_specs)
            vals = list(leaves) + [None] * len(steps)
            _run_in_order(vals, len(leaves), steps, places_, scalars, offsets, repeats)
        if out_shardings is not None:  # SPMD: tensors updated in place stay where they were
            return [vals[p] if sh is None
                    else jax.lax.with_sharding_constraint(vals[p], retarget(sh))
                    for p, sh in zip(root_pos, out_shardings)]
        return [vals[p] for p in root_pos]
    run.__name__ = run.__qualname__ = name  # jit names the module jit_<name>
    return run


def _lower_op(info, args, scalars, place):
    try:
        return _trace_op(info, args, scalars, *place)
    except Exception as e:  # runs while tracing only: no cost in the executable
        src, scope = place  # an optimizer's op was recorded with no scope: said so
        add_op_note(e, "lowering failed in", info, src,
                    "" if scope.startswith(PARAM_SEGMENT) else scope)
        raise


def _run_in_order(vals, n_leaves, steps, places, scalars, offsets, repeats) -> None:
    """The graph's ops in ``repeats.order``: each run of repeated layers as one
    ``lax.scan`` (``graph/repeats.py``); a run whose scan fails to trace is unrolled."""
    # value position -> (stacked array, layer): a run's results; positions -> the
    # stacked values at them
    stacked: dict = {}
    for item in repeats.order:
        if isinstance(item, tuple):
            run = repeats.runs[item[1]]
            try:
                _scan_run(vals, n_leaves, steps, places, scalars, offsets, run, stacked)
                continue
            except Exception as e:  # e.g. a carry whose type changes from layer to layer
                metrics.counter("ScanLayersUnrolled")
                if config.debug:
                    print(f"xlanb: {run.describe()}: unrolled, the loop failed to trace: "
                          f"{type(e).__name__}: {e}", file=sys.stderr)
                for ops in (run.segments[::-1] if run.reverse else run.segments):
                    for j in ops:
                        _eval(vals, n_leaves, steps, places, scalars, offsets, j)
                continue
        _eval(vals, n_leaves, steps, places, scalars, offsets, item)


def _eval(vals, n_leaves, steps, places, scalars, offsets, j) -> None:
    info, ins = steps[j]
    n = len(info.scalar_specs)
    vals[n_leaves + j] = _lower_op(info, [vals[i] for i in ins],
                                   scalars[offsets[j]:offsets[j] + n], places[j])


UNSTACK = "unstack"  # the name-stack segment of a loop's results taken out per layer


def _stack(values):
    return jax.tree_util.tree_map(lambda *a: jax.numpy.stack(a), *values)


def _stack_at(vals, positions, stacked):
    """The values at ``positions`` stacked; where they are one earlier run's stacked
    result, layer by layer (the activations a backward run reads from its forward
    run), that result itself: slicing it and stacking the slices again would make XLA
    compile a slice and a concatenation per layer. The same values stacked for an
    earlier run (the weights, read by the forward, backward and update loops) are
    stacked once."""
    first = stacked.get(positions[0])
    if first is not None and first[1] == 0:
        arr = first[0]
        if all(stacked.get(p, (None,))[0] is arr and stacked[p][1] == s
               for s, p in enumerate(positions)) and _leading(arr) == len(positions):
            return arr
    key = tuple(positions)
    arr = stacked.get(key)
    if arr is None:
        arr = stacked[key] = _stack([vals[p] for p in positions])
    return arr


def _leading(tree) -> int:
    leaves = jax.tree_util.tree_leaves(tree)
    return leaves[0].shape[0] if leaves else -1


def _scan_run(vals, n_leaves, steps, places, scalars, offsets, run, stacked) -> None:
    """One run of repeated layers as ``lax.scan``: the carry in, the per-layer inputs
    and lifted scalars stacked (in layer order), the body traced once with the first
    layer's ops (their scope and line name the HLO's instructions), and each value used
    outside the run taken back out of the stacked results."""
    body_ops = run.segments[0]
    carry_in = [vals[run.ext[run.first][e]] for e, _ in run.carry]
    invariant = {e: vals[run.ext[0][e]] for e in run.invariant}
    xs = [_stack_at(vals, [ext[e] for ext in run.ext], stacked) for e in run.xs]
    scal = []
    for m, j in enumerate(body_ops):
        n = len(steps[j][0].scalar_specs)
        scal.append([_stack([scalars[offsets[ops[m]] + q] for ops in run.segments])
                     for q in range(n)] if n else [])
    local_of = {n_leaves + j: m for m, j in enumerate(body_ops)}
    # per body op: its inputs as ("local", m) or ("ext", slot)
    ext_slot = {v: e for e, v in enumerate(run.ext[0])}
    wiring = [[("l", local_of[i]) if i in local_of else ("e", ext_slot[i]) for i in steps[j][1]]
              for j in body_ops]
    carry_slots = {e: c for c, (e, _) in enumerate(run.carry)}
    xs_slots = {e: q for q, e in enumerate(run.xs)}

    def body(carry, x):
        xv, sv = x
        local = []
        for m, j in enumerate(body_ops):
            args = []
            for kind, v in wiring[m]:
                if kind == "l":
                    args.append(local[v])
                elif v in carry_slots:
                    args.append(carry[carry_slots[v]])
                elif v in xs_slots:
                    args.append(xv[xs_slots[v]])
                else:
                    args.append(invariant[v])
            local.append(_lower_op(steps[j][0], args, sv[m], places[j]))
        return [local[m] for _, m in run.carry], [local[m] for m in run.exported]

    _, ys = jax.lax.scan(body, carry_in, (xs, scal), reverse=run.reverse)
    # named, so that the compile profile counts these per-layer slices as the loop's
    # (graph/compile_time.py: LOOPS), not as xlanb's other ops
    with jax.named_scope(UNSTACK):
        for s, ops in enumerate(run.segments):
            for q, m in enumerate(run.exported):
                vals[n_leaves + ops[m]] = jax.tree_util.tree_map(lambda a, s=s: a[s], ys[q])
                stacked[n_leaves + ops[m]] = (ys[q], s)


def sharding_of(a):
    return getattr(a, "sharding", None)


def leaf_mesh(plan: GraphPlan):
    """The mesh of a graph that touches a sharded tensor (a sharded leaf or a
    ``mark_sharding`` constraint), or None."""
    if not session.spmd:
        return None
    return common_mesh([sharding_of(n.data) for n in plan.leaves]
                       + [info.sharding for info, _ in plan.steps if info.sharding is not None])


def mesh_leaves(plan: GraphPlan):
    """``(arrays, mesh)``: the leaves' arrays and, if the graph touches a sharded tensor,
    its mesh, with every unsharded leaf replicated onto it (kept on the leaf, so the next
    step does not copy it again)."""
    arrays = [n.data for n in plan.leaves]
    mesh = leaf_mesh(plan)
    if mesh is None:
        return arrays, None
    for i, (n, a) in enumerate(zip(plan.leaves, arrays)):
        if not isinstance(a, tuple) and a.sharding.device_set != mesh.device_set:
            arrays[i] = n.data = on_mesh(a, mesh)
    return arrays, mesh


def leaf_shardings(plan: GraphPlan, mesh) -> tuple:
    """Each leaf's sharding on ``mesh`` as ``mesh_leaves`` would leave it, without moving
    anything: a leaf on the mesh keeps its own, any other is replicated."""
    out = []
    for n in plan.leaves:
        s = sharding_of(n.data)
        out.append(s if s is not None and s.device_set == mesh.device_set
                   else jax.sharding.NamedSharding(mesh.mesh, jax.sharding.PartitionSpec()))
    return tuple(out)


def kept_shardings(placed, mesh):
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


_NOT_LOOKED = object()
# "auto" loops a TPU compile's repeated layers from this many on. The TPU compile of the
# BERT training step (hidden 256, AdamW; v5e:1x1, 2 cores): 2 layers 25 s unrolled, 36 s
# looped; 8 layers 41 s and 33 s; 24 layers 97 s and 57 s (docs/benchmarks.md)
AUTO_MIN_LAYERS = 8


class GraphLowering:
    """A graph's first stage: what it computes, made once per structure from its plan.

    It holds a recipe (the op infos and their wiring, the roots' positions and where each
    op was recorded), the leaves' and lifted scalars' abstract values, and, on a mesh,
    the leaves' shardings. Not a function and not the nodes: JAX's tracing, lowering
    and compilation caches are keyed by the function, its jaxpr and its module (held
    weakly, up to 2,048 each), so a function kept for every graph would keep each
    graph's executable loaded after xlanb dropped it; ``lower`` makes one for each
    lowering instead. A lowering lives as long as its graph's record; nodes should not."""

    __slots__ = ("device", "recipe", "op_names", "leaf_metas", "leaf_origins", "scalar_kinds",
                 "shardings",
                 "mesh", "keep", "hash", "module", "n_ops", "n_inputs", "n_outputs",
                 "repeats", "_found")

    def __init__(self, plan: GraphPlan, device: int, shardings=None, mesh=None, keep=None,
                 graph_hash: str | None = None):
        self.device = device
        self.recipe = (plan.steps, plan.root_pos, [(n.src, n.scope) for n in plan.op_nodes])
        self.op_names = frozenset(info.name for info, _ in plan.steps)
        self.leaf_metas = tuple(leaf_meta(n) for n in plan.leaves)
        # what made each leaf (``file:line``, scope, aten op), for reports on its buffer
        self.leaf_origins = tuple((n.src.where if n.src else "", n.scope,
                                   n.info.name) for n in plan.leaves)
        self.scalar_kinds = tuple(k for info, _ in plan.steps for k in info.scalar_specs)
        self.shardings = shardings  # per leaf, on ``mesh``; None: one device
        self.mesh = mesh
        self.keep = keep            # per root, where an in-place update stays (SPMD)
        self.n_ops, self.n_inputs, self.n_outputs = len(plan.steps), len(plan.leaves), len(plan.roots)
        # repeated layers lowered as one loop each (graph/repeats.py; XLANB_SCAN_LAYERS),
        # for this graph's own device; a TPU target's compile decides for itself
        self._found = {}  # asked_only -> find_repeats' answer
        try:
            platform = jax_device(device).platform
        except RuntimeError:  # not one of this process's devices: no loops to decide
            platform = ""
        self.repeats = self.repeats_for(platform)
        if graph_hash and self.repeats is not None:  # not the unrolled graph's executable
            graph_hash = hashlib.blake2b((graph_hash + repr(self.repeats.runs)).encode(),
                                         digest_size=16).hexdigest()
        self.hash = graph_hash
        self.module = module_name(graph_hash) if graph_hash else "jit_run"

    def repeats_for(self, platform: str):
        """The runs to lower as loops in a compile for ``platform`` ("cpu", "gpu",
        "tpu"), or None: every run with ``scan_layers`` on; with "auto", a TPU's compile
        of a graph with a run of ``AUTO_MIN_LAYERS`` or more. Found runs are not looped
        on a mesh (the stacked weights' shardings are the partitioner's guess there).
        The loops the program asked for (``xlanb.scan``, ``scan_layers``) are looped
        whatever the platform or mesh, unless ``scan_layers`` is off. Looked for once
        per lowering."""
        setting = config.scan_layers
        if not setting:
            return None
        if (setting != "auto" or platform == "tpu") and self.shardings is None:
            found = self._find(False)
            if found is not None and (setting != "auto" or max(
                    len(run.layers) for run in found.runs) >= AUTO_MIN_LAYERS):
                return found
        return self._find(True) if LOOP_OP in self.op_names else None

    def _find(self, asked_only: bool):
        found = self._found.get(asked_only, _NOT_LOOKED)
        if found is _NOT_LOOKED:
            steps, root_pos, places = self.recipe
            found = self._found[asked_only] = find_repeats(steps, self.n_inputs, root_pos,
                                                           places, asked_only)
        return found

    @classmethod
    def of(cls, plan: GraphPlan, device: int, shardings=None, mesh=None, keep=None):
        """The lowering of ``plan`` with its graph hash (the same in every process; on a
        mesh it holds the leaves' shardings and where updates stay)."""
        graph_hash = stable_hash(plan, device)
        if shardings is not None:
            graph_hash = hashlib.blake2b(
                (graph_hash + repr([sharding_text(s) for s in shardings])
                 + repr([s and sharding_text(s) for s in keep or ()])).encode(),
                digest_size=16).hexdigest()
        return cls(plan, device, shardings, mesh, keep, graph_hash)

    def specs(self) -> tuple:
        """The graph function's abstract arguments on xlanb's devices: leaf arrays and
        lifted scalars (on a mesh: the leaves' shardings, the scalars replicated)."""
        leaves = [tensor_spec(m, self.device) for m in self.leaf_metas]
        scalars = [scalar_spec(k, self.device) for k in self.scalar_kinds]
        if self.shardings is None:
            return leaves, scalars
        return ([jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh)
                 for s, sh in zip(leaves, self.shardings)],
                [jax.ShapeDtypeStruct(s.shape, s.dtype, weak_type=s.weak_type, sharding=self.mesh)
                 for s in scalars])

    def function(self, repeats=_NOT_LOOKED):
        """A new graph function (see the class docstring for why it is not kept), with
        this device's loops unless ``repeats`` says which."""
        return _graph_fn_of(self.recipe, self.keep, self.module.removeprefix("jit_"),
                            self.repeats if repeats is _NOT_LOOKED else repeats)

    def lower(self, lower_metric: str | None = None):
        """Lowered for xlanb's devices (a ``jax.stages.Lowered``), timed into
        ``lower_metric`` if one is given."""
        # One frame per location: each op's is its user's line (_trace_op), and the
        # lowering's own stack under it, 15 frames, made BERT's locations 1.1 kB each
        # (annotate_op_types printed them for 0.1 s of its step's critical path)
        with _one_frame():
            if lower_metric is None:
                specs = self.specs()
                with jax_context(specs):
                    lowered = jax.jit(self.function()).lower(*specs)
            else:
                lowered = lower_jitted(self.function(), self.specs(), lower_metric=lower_metric)
        annotate_op_types(lowered, self.op_names)
        return lowered

    def lower_for(self, target: Target):
        """Lowered for a TPU ``target``: every sharding on xlanb's mesh mapped onto the
        topology's devices in order; a graph on one device goes to its first chip."""
        with retargeting(target):
            leaves, scalars = self.specs()
            specs = ([jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=retarget(s.sharding))
                      for s in leaves],
                     [jax.ShapeDtypeStruct(s.shape, s.dtype, weak_type=s.weak_type,
                                           sharding=retarget(s.sharding)) for s in scalars])
            # JAX places a graph by its arguments' devices; one with none (every value
            # made inside it) is placed by its outputs', or it would lower for the CPU
            out = None if specs[0] or specs[1] else SingleDeviceSharding(target.devices[0])
            with jax_context(specs):
                lowered = jax.jit(self.function(self.repeats_for("tpu")),
                                  out_shardings=out).lower(*specs)
        annotate_op_types(lowered, self.op_names)
        return lowered


def lower_graph(plan: GraphPlan, device: int, arrays=None, mesh=None, keep=None):
    """``plan`` lowered by JAX (a ``jax.stages.Lowered``), without compiling it (on
    ``mesh`` with the shardings of ``arrays``, as ``mesh_leaves`` gives them, and
    ``keep``, where in-place updates stay): the module a sync compiles, under its name
    (``jit_xlanb_graph_<hash>``)."""
    shardings = tuple(sharding_of(a) for a in arrays) if mesh is not None else None
    return GraphLowering.of(plan, device, shardings, mesh, keep).lower()
