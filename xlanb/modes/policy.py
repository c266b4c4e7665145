"""The execution modes: what each does with one op, and how a sync of its pending work runs.

One object per mode (``LAZY``, ``EAGER``, ``OPBYOP``), bound to a ``ModeState`` when its
mode is set (``state.policy``), as JAX binds a trace: the dispatcher makes one attribute
lookup and one call per op (``state.policy.op``), and a sync one call per graph
(``state.policy.run_sync_plan``). To add a mode, subclass ``ModePolicy`` here, add its name to
``base.config.MODES`` and to ``POLICIES``. ``modes/switch.py`` only switches between them.

Decompositions that trace on JAX values ("direct", ``session.direct``) are not a mode:
they run at once whatever the mode is (record.apply_op).
"""
from __future__ import annotations

from ..base import metrics
from ..base.config import config
from ..base.frames import user_frame
from ..base.scopes import current_scope, scope_stack
from ..base.session import ModeState, session, set_policies
from ..executables.background import compile_op_ahead, compiles_in_flight
from ..values.checks import checked, integer_division, without_failed
from ..executables.compile import Build, add_op_note
from ..values.fills import settled_if_empty
from ..execute.graphs import cached_graph, run_plan_as_graph
from ..values.memory import check_op
from ..execute.opbyop import run_plan_op_by_op
from ..executables.prefix import missing_ops
from ..executables.single_op import direct_call, op_executable, run_op_on_arrays
from ..ir.nodes import GraphPlan, Node, OpSignature, frontier, reachable
from ..pending.live import end_waiting, pending_roots, set_aside, swept_roots
from ..pending.realize import node_array, sync
from .record import _x64, run_op_executable

_counters = metrics.counters_table()  # counted in place: this is the eager hot path


class ModePolicy:
    """A mode. ``recording``: its ops become nodes that a sync runs later."""
    name = ""
    recording = False

    def op(self, state: ModeState, info: OpSignature, inputs: tuple, scalars: tuple,
           depth: int = 3) -> Node:
        """Record or run one op whose OpSignature is known; its node. ``depth``: where the walk
        for the user's line starts (user_frame's), from this method's frame."""
        raise NotImplementedError

    def run_sync_plan(self, plan: GraphPlan, device: int, cause: str, src, placed) -> list:
        """A sync's pending graph ``plan`` on ``device``, run; the roots' arrays."""
        raise NotImplementedError

    # What a sync and a mode switch ask of the mode (pending/realize.py, modes/switch.py), so that they
    # read no mode's state themselves.

    def switch_syncs(self, state: ModeState, to: str) -> bool:
        """Whether leaving this mode for ``to`` syncs the pending work first: a recording
        mode's, when eager ops would otherwise see pending values; ops this mode left
        recorded (``state.deferred``), always, so no other mode's graph depends on them."""
        return bool(state.deferred) or (self.recording and to == "eager")

    def roots_to_run(self, state: ModeState, roots: list) -> list:
        """The nodes a read of ``roots`` runs."""
        return roots

    def synced(self, state: ModeState) -> None:
        """After a sync (or a sync that found nothing to run)."""

    def run_failed(self, state: ModeState, nodes: list) -> None:
        """A run of the pending ``nodes`` raised; they stay pending."""

    def __repr__(self) -> str:
        return f"<mode policy {self.name}>"


class Lazy(ModePolicy):
    """Record every op; a sync compiles the whole graph once (cached by structure)."""
    name = "lazy"
    recording = True

    def op(self, state, info, inputs, scalars, depth=3):
        return Node(info, inputs, scalars, None, user_frame(depth),
                    scope_stack[-1] if scope_stack else "")

    def roots_to_run(self, state, roots):
        # A read's graph also hands out what the pending work left after it would
        # compute again: the live tensors it computes on the way (a KV cache updated in
        # place, or grown by a cat, is an input of the logits that generate's stopping
        # check reads), and the values inside it that other live tensors' pending work
        # reads (the attention mask grown by a cat after each token's forward). Left
        # pending, every token's graph recomputed each earlier token's (18 -> 283 ->
        # 527 -> 730 ops: a new graph per token, and quadratic work); handed out, the
        # pending work starts from device data, and each token's graph is the same.
        live = without_failed(pending_roots())
        if not live:
            return roots
        inside = reachable(roots)
        extra = [n for n in live if id(n) in inside and not n.info.multi]
        outside = [n for n in live if id(n) not in inside]
        if outside:
            extra += frontier(outside, inside)
        return list(roots) + extra if extra else roots

    def run_sync_plan(self, plan, device, cause, src, placed):
        return run_plan_as_graph(plan, device, cause, src, placed)


class OpByOp(Lazy):
    """Record every op; a sync runs the graph node by node through the single-op cache."""
    name = "opbyop"

    def run_sync_plan(self, plan, device, cause, src, placed):
        return run_plan_op_by_op(plan)


class Eager(ModePolicy):
    """Run each op now through its single-op executable. An op with none is recorded
    instead, and so is every op after it (``state.deferred`` counts them), until a value
    is needed: that run of ops compiles as one graph, quickly (``config.eager_runs``,
    ``graphs.run_plan_as_graph(run=True)``), and a signature seen again gets its own optimized
    executable on the compile threads. With runs off, each new op compiles alone on the
    compile threads, and the ops recorded meanwhile run in order once it is ready."""
    name = "eager"

    def roots_to_run(self, state, roots):
        # a read runs the whole open run (or every op waiting on a compile): the run is
        # one graph, and what was recorded after the value read would otherwise wait on
        if state.deferred:
            return list(roots) + without_failed(swept_roots())
        return roots

    def run_failed(self, state, nodes):
        # the failed run's ops stay pending, out of other reads' runs; the next op opens
        # a new run
        set_aside(nodes)
        end_waiting()

    def synced(self, state):
        if state.deferred:  # the open run ran (or its ops were never needed)
            end_waiting()

    def op(self, state, info, inputs, scalars, depth=3):
        deferred = state.deferred
        if not deferred:
            call = info.call
            if call is not None and not session.spmd and config.memory_limit is None:
                # the executable is known and nothing (ops waiting on compiles, sharding,
                # a memory limit) stands between the op and its run: the hot path
                _counters["OpCacheHit"] = _counters.get("OpCacheHit", 0) + 1
                return run_op_executable(info, call, inputs, scalars)
        elif deferred < config.eager_runs and not session.spmd and config.background_compile:
            # A run is open and the op joins it, recorded as lazy records: what _run_later
            # does for an op whose store look is done and whose own compile is not there
            # to collect. Most of a decode step's ops come here (a cached generate call:
            # 3,900 ops, four calls each on the way to _run_later).
            pending = info.compiling
            if (pending is None or info.exe is not None or not pending.done()) \
                    and (info.seen != 0 or info.exe is not None or pending is not None) \
                    and not integer_division(info):
                state.deferred = deferred + 1
                return Node(info, inputs, scalars, None, user_frame(depth),
                            scope_stack[-1] if scope_stack else "")
        return self._op_slow(state, info, inputs, scalars)

    def _op_slow(self, state, info, inputs, scalars) -> Node:
        if session.spmd:  # a tensor was sharded: executables are chosen by input shardings
            arrays = [n.data if n.data is not None else node_array(n) for n in inputs]
            with _x64():
                data = run_op_on_arrays(info, arrays, scalars)
            return Node(info, (), (), data,
                        *((user_frame(), current_scope()) if info.lines else ()))
        call = info.call
        if call is None or state.deferred:
            if (info.exe is None or state.deferred or info.opens_run) \
                    and config.background_compile:
                node = self._defer(state, info, inputs, scalars)
                if node is not None:
                    return node
            try:
                call = op_executable(info)
            except Exception as e:  # lowering or compiling: name the op and the line, as lazy does
                add_op_note(e, "compiling failed for", info, user_frame(), current_scope())
                raise
        else:
            _counters["OpCacheHit"] = _counters.get("OpCacheHit", 0) + 1
        if config.memory_limit is not None:  # xlanb.memory_limit: checked before it runs
            check_op(info, user_frame())
        node = run_op_executable(info, call, inputs, scalars)
        if info.call is None and info.tiering is None and not info.opens_run:
            info.call = direct_call(call)  # (a quick one counts its uses; an opener defers)
        return node

    def _defer(self, state, info, inputs, scalars) -> Node | None:
        if config.eager_runs:
            return self._run_later(state, info, inputs, scalars)
        return self._wait_for_compile(state, info, inputs, scalars)

    def _run_later(self, state, info, inputs, scalars) -> Node | None:
        """Eager runs: an op with no executable of its own (none in the store either)
        opens a run, and every op after it joins the run until a value is needed (a
        read, a sync, a mode switch; realize.materialize) or the run holds
        ``config.eager_runs`` ops. Returns the recorded node, or None to run the op now.
        ``Eager.op`` records an op that joins an open run and needs none of the checks
        below itself (the hot path): a check added here belongs in its condition too."""
        if state.deferred >= config.eager_runs:
            sync(cause="eager run limit")
        if integer_division(info):
            # its divisor is checked before it runs, as CPU torch raises (a graph would
            # give XLA's value): the run ends here and the op runs alone
            if state.deferred:
                sync(cause="integer division")
            return None
        if info.exe is None and info.compiling is None and info.seen == 0:
            info.seen = -1  # looked in the store once; a run that compiles it counts up from 0
            build = Build.op(info)  # most have none: a look that counts no miss first
            exe = build.stored() if build.in_store() else None
            if exe is not None:  # a new process: its optimized executable is stored
                info.exe = checked(exe, info)
                metrics.counter("OpCompile")
        pending = info.compiling
        if pending is not None and pending.done() and info.exe is None:
            try:  # its own executable finished compiling (a tier-up): collect it
                op_executable(info)
            except Exception:  # noqa: BLE001 - it stays in the run, which reports errors
                pass
        if not state.deferred:
            if info.exe is not None and not info.opens_run:
                if all(n.data is not None or settled_if_empty(n) for n in inputs):
                    return None
            # An op that opened a run opens it again once it has an executable of its
            # own (a look at the ids an embedding indexes compiled their view alone;
            # ops in new company tier up): else the same forward, read at the same
            # places, began one op later, a new run that compiled again (a GPT-2
            # forward: 180 ms, where the cached run takes 6). A run whose ops all have
            # executables still runs op by op (``run_sync_plan``).
            info.opens_run = True
        state.deferred += 1
        return Node(info, inputs, scalars, None, user_frame(), current_scope())

    def _wait_for_compile(self, state, info, inputs, scalars) -> Node | None:
        """An op whose executable is still compiling, or whose inputs wait on one, is
        recorded instead of run, and Python goes on to the next op (XLA compiles without
        the GIL, so compiles overlap each other and the Python that follows). The recorded
        ops run in order, through the same executables, once no compile is in flight or
        when a value is needed. Returns the recorded node, or None to run the op now."""
        if state.deferred and not compiles_in_flight():
            sync(cause="background compiles done")
        try:
            pending = info.exe is None and (info.compiling or compile_op_ahead(info))
        except Exception as e:  # a lowering error, raised here: name the op and the line
            add_op_note(e, "lowering failed in", info, user_frame(), current_scope())
            raise
        waiting = False
        for n in inputs:
            if n.data is None and not settled_if_empty(n):  # an empty costs nothing to settle
                waiting = True
        if waiting or (pending and not pending.done()):
            state.deferred += 1
            return Node(info, inputs, scalars, None, user_frame(), current_scope())
        return None

    def run_sync_plan(self, plan, device, cause, src, placed):
        # What eager syncs is a run of ops: one graph where some lack an executable (or
        # the graph is known), else in order, one by one, as they would have run.
        if not config.eager_runs or session.spmd:
            return run_plan_op_by_op(plan)
        if cached_graph(plan, device) is not None:
            return run_plan_as_graph(plan, device, cause, src, placed, run=True)
        missing = missing_ops(plan)
        if not missing:
            return run_plan_op_by_op(plan)
        if few_signatures(plan, missing):
            metrics.counter("EagerRunOpByOp")
            return run_plan_op_by_op(plan, quick=True)
        return run_plan_as_graph(plan, device, cause, src, placed, run=True)


# A run's graph compiles at the quick tier in about 2 ms per op (the BERT step: 824 ops
# in 1.6-1.9 s), one new single op in about 16 (tanh, matmul, softmax: 14-18 ms), and a
# single op runs in tens of microseconds. A run of many ops and few new signatures is a
# Python loop over one op (``torch.stack([op(s) for s in x])``: 2049 ops, 5 signatures;
# its graph took 3-6 s to compile): compiling those few ops alone costs less than the
# graph, they serve the loop's next call too, and the run goes op by op. The bar is
# twice the graph's estimated cost, since a graph runs fused and comes back cached.
_GRAPH_MS_PER_OP = 2.0
_OP_COMPILE_MS = 16.0


def few_signatures(plan: GraphPlan, missing: list) -> bool:
    """Whether ``plan``, an eager run whose ``missing`` ops have no executable, runs op
    by op for less compile time than its graph would take."""
    return len(missing) * _OP_COMPILE_MS * 2 <= len(plan.steps) * _GRAPH_MS_PER_OP


LAZY, EAGER, OPBYOP = Lazy(), Eager(), OpByOp()
POLICIES = {p.name: p for p in (LAZY, EAGER, OPBYOP)}
set_policies(POLICIES)
