"""``xlanb.profile``: where a step's time goes, by source line, module scope and aten op,
by phase (tracing, compile, transfer, execute, wait), and as a Chrome/Perfetto trace.

What is recorded, only while a profile is open:

- every aten op on the xla device, through a torch dispatch mode: its wall time on the
  calling thread, its user line and module scope. Lazy mode: the time to trace it.
  Eager mode: the time to run it (dispatch, the cached executable, its completion as far
  as the call waits). Opbyop: the time to record it;
- every phase sample xlanb's metrics record (``CompileTime``, ``OpCompileTime``,
  ``ExecuteTime``, ``TransferToDeviceTime``, ``OpCompileWaitTime``, ...), as a timed
  event on the thread that made it (a metrics listener). A phase that happens inside an
  op (an eager op compiling, a ``.item()`` that syncs) is that op's, and is taken out of
  the op's own (self) time;
- each sync's graph (lazy) or op-by-op run, with the line that synced;
- JAX's own trace (``jax.profiler``), when ``device=True``, merged into the export.

Device time per op. With ``device=True``, XLA's own profiler times every instruction of
each lazy graph as it runs (XLA:CPU reports each thunk, GPU each kernel, TPU each op, with
its module and instruction name), and each instruction's HLO metadata names the aten op,
module scope and line xlanb traced it from: ``device (s)`` columns, measured. Each graph
compiles to a module of its own name (``jit_xlanb_graph_<hash>``), so the events find
their graph. A fusion counts at the op it was built around (its metadata's). Where no
such events come (another backend, or ``device=False``), ``replay=True`` (or
``p.replay()``) runs each profiled graph op by op through the single-op cache, timing
each op alone, and spreads the graph's measured execute time over its ops in
proportion: ``device, replayed (s)``, an estimate, not a measurement of the fused graph.
Eager and opbyop time each op directly.

Nothing is added while no profile is open: one empty-list test per metrics sample and
per sync.
"""
from __future__ import annotations

import gzip
import html
import json
import os
import shutil
import tempfile
import threading
import time
import warnings
from collections import defaultdict
from typing import NamedTuple

import jax
import torch
from torch.utils._python_dispatch import TorchDispatchMode, _pop_mode, _push_mode

from ..base import metrics
from ..base.frames import SourceLoc, format_loc, user_frame
from ..base.scopes import current_scope
from ..base.session import mode_state, session
from ..base.formats import format_hash, format_table, format_table_html
from ..executables.background import compiles_in_flight
from ..runtime import libtpu
from .debug_nans import backward_origin, note_forward
from ..execute.graphs import graph_log
from ..execute.opbyop import time_op_by_op
from ..graph.hlo_text import instruction_origins
from ..pending import realize
from ..ir.tensor import XlaTensor

# metrics samples -> phase. LowerTime/OpLowerTime are parts of CompileTime/OpCompileTime
# samples, and OpBackgroundCompileTime runs off the main thread: trace events only.
PHASE_OF = {
    "CompileTime": "compile", "OpCompileTime": "compile",
    "TransferToDeviceTime": "transfer", "TransferFromDeviceTime": "transfer",
    "ExecuteTime": "execute", "OpCompileWaitTime": "wait",
}
PHASES = ("python", "xlanb ops", "compile", "transfer", "execute", "wait")
# What the tables' words mean, said under them (once under a whole profile).
SHARE_NOTE = ("share: the row's total time (with its device time, where shown) as a "
              "percentage of the profiled wall time; rows overlap (a scope holds the scopes "
              "inside it), so shares need not add up to 100%")
UNNAMED_SCOPE_NOTE = ("Parent.?Module: a module its parent made during the call (not one of "
                      "its attributes, e.g. a loss built inside forward), named by its class")
_current_node = torch._C._current_autograd_node
_XLA_TID = 1 << 40  # tids for XLA's compile threads in an export (no real thread's)


class OpEvent(NamedTuple):
    name: str          # aten::addmm
    start: float       # perf_counter seconds
    dur: float         # wall seconds on the calling thread
    self_s: float      # dur minus the phases recorded inside it
    src: SourceLoc | None
    scope: str
    step: int
    mode: str          # lazy / opbyop: tracing; eager: running the op


class PhaseEvent(NamedTuple):
    name: str          # the metric: CompileTime, ExecuteTime, ...
    phase: str | None  # compile / transfer / execute / wait, None for trace-only
    start: float
    dur: float
    tid: int
    main: bool         # on the profiled thread
    src: SourceLoc | None  # the op or sync it happened in
    scope: str
    step: int


class _OpMode(TorchDispatchMode):
    def __init__(self, prof: "Profile"):
        super().__init__()
        self.prof = prof

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        prof = self.prof
        if XlaTensor not in types or session.direct:
            return func(*args, **kwargs)
        # any thread: backward ops run on autograd's device thread while the profiled
        # thread waits in .backward()
        # (torch leaves this mode while its handler runs: ops a decomposition calls
        # inside ``func`` do not come back here, they are part of this op's time)
        anode = _current_node()
        if anode is None:
            src, scope = user_frame(), current_scope()
            if torch.is_grad_enabled():
                note_forward(func)  # for the backward ops that differentiate it
        else:  # a backward op: the forward op's line and scope, where the user looks
            _name, _fwd, src, scope = backward_origin(anode)
            scope = scope or ""
        frame = [src, scope, 0.0]  # src, scope, nested phase seconds
        local = prof._local
        local.open = frame
        t0 = time.perf_counter()
        try:
            return func(*args, **kwargs)
        finally:
            dur = time.perf_counter() - t0
            local.open = None
            prof.ops.append(OpEvent(func._schema.name, t0, dur, max(dur - frame[2], 0.0),
                                    frame[0], frame[1], prof._step, mode_state().mode))


class Graph(NamedTuple):
    plan: object
    mode: str
    cause: str
    src: SourceLoc | None
    step: int
    execute_s: float   # the ExecuteTime sample of this run


class Profile:
    """What ``xlanb.profile()`` recorded. Views: ``by_line()``, ``by_scope()``,
    ``by_op()``, ``phases()``; ``export(path)`` writes a Chrome/Perfetto trace."""

    def __init__(self, device: bool = False, replay: bool = False):
        self.device = device
        self.replay_on_exit = replay
        self.ops: list[OpEvent] = []
        self.phase_events: list[PhaseEvent] = []
        self.graphs: list[Graph] = []
        self.steps: list[tuple[float, float]] = []   # (start, end) perf_counter
        self.replayed: dict = {}    # (src, scope, op) -> replayed device seconds
        # (src, scope, op) -> device seconds of lazy graphs' instructions: "measured" from
        # XLA's profiler trace (device=True), else "replayed" op by op (an estimate)
        self.device_ops: dict = {}
        self.device_kind = ""
        self.device_instrs: list = []  # (module, instruction, op, scope, src, seconds)
        self.t0 = self.t1 = 0.0
        self._tid = threading.get_ident()
        self._local = threading.local()  # .open: the op running on this thread
        self._step = 0
        self._step_start = 0.0
        self._mode = None
        self._jax_dir = None
        self._jax_t0 = 0.0
        self._running = False

    # -- recording

    def __enter__(self) -> "Profile":
        if self._running:
            raise RuntimeError("this profile is already recording")
        self._running = True
        if self.device and not libtpu.profiler_safe():
            # libtpu was loaded for a TPU target with no TPU here: JAX's profiler would
            # crash the process (runtime/libtpu.py); the op-by-op estimate stands in
            warnings.warn("xlanb.profile(device=True): JAX's profiler crashes in a process "
                          "where libtpu was loaded for a TPU target without a TPU; device "
                          "times are estimated by replaying op by op instead (profile in a "
                          "process that has not used xlanb.compile_for/xlanb.target)",
                          RuntimeWarning, stacklevel=2)
            self.device = False
            self.replay_on_exit = True
        if self.device:
            # XLA compiles still running on the compile threads (a tier-up nobody waits
            # for) would be traced as device work, and starting JAX's profiler while
            # they run is where a full test run once crashed: let them finish (30 s at most)
            deadline = time.perf_counter() + 30
            while compiles_in_flight() and time.perf_counter() < deadline:
                time.sleep(0.002)
            self._jax_dir = tempfile.mkdtemp(prefix="xlanb-profile-")
            opts = jax.profiler.ProfileOptions()
            opts.python_tracer_level = 0  # JAX's Python tracer would time every call
            self._jax_t0 = time.perf_counter()
            jax.profiler.start_trace(self._jax_dir, create_perfetto_trace=True,
                                     profiler_options=opts)
        metrics.add_listener(self._on_metric)
        realize.observers.append(self._on_sync)
        self._mode = _OpMode(self)
        _push_mode(self._mode)
        self.t0 = self._step_start = time.perf_counter()
        return self

    def __exit__(self, exc_type, exc, tb):
        self.t1 = time.perf_counter()
        try:
            _pop_mode()
        finally:
            metrics.remove_listener(self._on_metric)
            if self._on_sync in realize.observers:
                realize.observers.remove(self._on_sync)
            self._running = False
            if self.device:
                jax.profiler.stop_trace()
        if any(e.step == self._step for e in self.ops):  # ops after the last sync
            self.steps.append((self._step_start, self.t1))
        if self.device and self.graphs:
            self._measure_device()
        if self.replay_on_exit and exc_type is None:
            self.replay()
        return False

    def _on_metric(self, name: str, end: float, dur: float) -> None:
        # the profiled thread's, or inside an op (autograd's thread included): a phase of
        # the step; a compile thread's samples are trace events only
        open_op = getattr(self._local, "open", None)
        main = open_op is not None or threading.get_ident() == self._tid
        phase = PHASE_OF.get(name)
        if open_op is not None and phase is not None:
            open_op[2] += dur  # inside an op: not the op's own time
        src, scope = (open_op[0], open_op[1]) if open_op is not None else (None, "")
        self.phase_events.append(PhaseEvent(name, phase, end - dur, dur,
                                            threading.get_ident(), main, src, scope,
                                            self._step))

    def _on_sync(self, kind: str, what, info) -> None:
        if threading.get_ident() != self._tid:
            return
        if kind == "graph":
            mode, cause, src = info
            last = next((e for e in reversed(self.phase_events)
                         if e.name == "ExecuteTime" and e.main), None)
            self.graphs.append(Graph(what, mode, cause, src, self._step,
                                     last.dur if last is not None else 0.0))
        else:
            now = time.perf_counter()
            self.steps.append((self._step_start, now))
            self._step_start = now
            self._step += 1

    # -- device time per op, measured by XLA's profiler

    def _measure_device(self) -> None:
        """Device time per (line, scope, aten op) of the profiled lazy graphs, from XLA's
        own trace: XLA:CPU, GPU and TPU report each instruction (thunk, kernel or op)
        they run with its module and name (``hlo_module``, ``hlo_op``), and each
        instruction of a graph's optimized module carries the metadata xlanb put in
        (aten op, scope, the user's line). Fills ``device_ops`` (kind ``measured``) when
        the trace has such events for the profiled graphs."""
        events = self._raw_jax_events()
        per_instr: dict = defaultdict(float)
        for e in events:
            a = e.get("args")
            if e.get("ph") == "X" and a and "hlo_op" in a and "dur" in e:
                per_instr[(a.get("hlo_module", ""), a["hlo_op"])] += e["dur"] * 1e-6
        if not per_instr:
            return
        modules = {rec.module: rec for rec in graph_log if rec.module}
        locs: dict = {}  # "file:line" -> the SourceLoc the graph's ops were recorded at
        recorded: dict = {}  # (aten op, scope) -> the line of the first such op recorded
        for g in self.graphs:
            for n in g.plan.op_nodes:
                if n.src is not None:
                    locs.setdefault(n.src.where, n.src)
                    recorded.setdefault((n.info.name, n.scope), n.src)
        origins: dict = {}
        found = defaultdict(float)
        self.device_instrs = []
        for (module, instr), secs in per_instr.items():
            rec = modules.get(module)
            if rec is None:
                continue
            table = origins.get(module)
            if table is None:
                try:
                    table = origins[module] = instruction_origins(rec.executable.as_text())
                except Exception:  # an executable that cannot print its module
                    table = origins[module] = {}
            o = table.get(instr)
            op = (o.op or f"xla::{o.opcode}") if o else f"xla::{instr}"
            scope = o.scope.replace("/", ".") if o else ""
            # the innermost frame that is a line the graph's ops were recorded at (the
            # frames inside it are xlanb's lowering and JAX's)
            src = next((locs[f] for f in o.sources if f in locs), None) if o else None
            if src is None:  # no user frame kept (XLA merged or moved it): the op's line
                src = recorded.get((op, scope))
            found[(src, scope, op)] += secs
            self.device_instrs.append((module, instr, op, scope, src, secs))
        if found:
            self.device_ops = dict(found)
            self.device_kind = "measured"

    # -- device time per op, by replay

    def replay(self, repeats: int = 3) -> None:
        """Time each profiled lazy graph op by op through the single-op cache and spread
        its measured execute time over its ops in proportion (``device (replayed)``
        columns): estimates, for a backend whose trace has no per-instruction events (a
        ``device=True`` measurement, where there is one, stays what the tables show).
        Each distinct graph is replayed once."""
        replayed = self.replayed = defaultdict(float)
        by_key: dict = {}
        for g in self.graphs:
            key = (g.mode, g.plan.key)
            entry = by_key.setdefault(key, [g.plan, 0.0])
            entry[1] += g.execute_s
        for plan, execute_s in by_key.values():
            times = time_op_by_op(plan, repeats)
            total = sum(times)
            if total <= 0:
                continue
            scale = execute_s / total
            for (info, _), node, t in zip(plan.steps, plan.op_nodes, times):
                if t:
                    replayed[(node.src, node.scope, info.name)] += t * scale
        if self.device_kind != "measured":  # a measurement beats an estimate
            self.device_ops, self.device_kind = dict(replayed), "replayed"

    # -- views

    @property
    def wall(self) -> float:
        return (self.t1 or time.perf_counter()) - self.t0

    def _rows(self, key):
        """{key: [calls, self, total, replayed]} over op events (+ replayed device time)."""
        acc: dict = defaultdict(lambda: [0, 0.0, 0.0, 0.0])
        for e in self.ops:
            r = acc[key(e.src, e.scope, e.name)]
            r[0] += 1
            r[1] += e.self_s
            r[2] += e.dur
        for g in self.graphs:  # a sync's run counts at the line that synced (until
            if g.execute_s and not self.device_ops:  # device time spreads it over its ops)
                r = acc[key(g.src, "", "xla::graph")]
                r[0] += 1
                r[1] += g.execute_s
                r[2] += g.execute_s
        for (src, scope, name), t in self.device_ops.items():
            acc[key(src, scope, name)][3] += t
        return acc

    def _table(self, title: str, acc: dict, label, limit: int | None) -> "ProfileTable":
        wall = self.wall or 1.0
        items = sorted(acc.items(), key=lambda kv: -(kv[1][2] + kv[1][3]))
        if limit is not None:
            items = items[:limit]
        replayed = any(v[3] for _, v in items)
        device_head = "device (s)" if self.device_kind == "measured" else "device, replayed (s)"
        head = ("where", "calls", "self (s)", "total (s)", "share") + \
            ((device_head,) if replayed else ())
        rows = []
        for k, (calls, self_s, total, rep) in items:
            row = (label(k), str(calls), f"{self_s:.4f}", f"{total:.4f}",
                   f"{100 * (total + rep) / wall:.1f}%")
            rows.append(row + ((f"{rep:.4f}",) if replayed else ()))
        notes = [SHARE_NOTE]
        if self.device_kind == "measured":
            notes.append("device: each lazy graph's instructions as XLA's profiler timed "
                         "them, by the aten op, scope and line in their HLO metadata")
        elif self.graphs and not self.device_ops:
            notes.append("lazy graphs ran fused: their execute time is one row at the line "
                         "that synced (xlanb.profile(device=True) measures it per instruction "
                         "through XLA's profiler; p.replay() estimates it op by op)")
        if any(isinstance(k, str) and ".?" in k for k, _ in items):
            notes.append(UNNAMED_SCOPE_NOTE)
        return ProfileTable(title, head, rows, "\n".join(notes), [k for k, _ in items])

    def by_line(self, limit: int | None = 20) -> "ProfileTable":
        """Time per user source line: calls, self time (the ops' own), total (with the
        compiles, transfers and waits inside them), share of the profiled wall time."""
        return self._table("by line", self._rows(lambda src, scope, name: src),
                           lambda k: format_loc(k) or "(no user line)", limit)

    def by_op(self, limit: int | None = 20) -> "ProfileTable":
        """Time per aten op."""
        return self._table("by op", self._rows(lambda src, scope, name: name), str, limit)

    def by_scope(self, limit: int | None = 20) -> "ProfileTable":
        """Time per module scope: self = ops directly in the scope, total = with every
        scope inside it (``BertModel.encoder.layer.0`` holds its attention and MLP)."""
        flat = self._rows(lambda src, scope, name: scope)
        acc: dict = defaultdict(lambda: [0, 0.0, 0.0, 0.0])
        for scope, (calls, self_s, total, rep) in flat.items():
            acc[scope][0] += calls
            acc[scope][1] += self_s + rep
            parts = scope.split(".") if scope else []
            for i in range(len(parts) + 1):
                r = acc[".".join(parts[:i])]
                r[2] += total + rep
        for r in acc.values():
            r[3] = 0.0
        return self._table("by scope", acc, lambda k: k or "(top level)", limit)

    def phases(self) -> "ProfileTable":
        """Per step (a step ends at each sync): where its wall time went.

        - ``xlanb ops``: the ops' own time in xlanb (lazy and opbyop: recording them;
          eager: running them), on the profiled thread and autograd's;
        - ``compile``, ``transfer``, ``execute``, ``wait``: xlanb's metrics samples on
          those threads (graph compiles and single-op compiles, copies, graph runs,
          waits on background compiles);
        - ``python``: the rest of the wall time, the host running Python outside xlanb
          (the model's and optimizer's code, autograd's engine): wall minus the others.

        ``measured`` is the sum of all but ``python``; it can never exceed ``wall`` unless
        phases were counted twice."""
        rows = []
        sums = {p: 0.0 for p in PHASES}
        walls = 0.0
        for i, (s0, s1) in enumerate(self.steps):
            ph = {p: 0.0 for p in PHASES}
            for e in self.ops:
                if e.step == i:
                    ph["xlanb ops"] += e.self_s
            for e in self.phase_events:
                if e.step == i and e.main and e.phase is not None:
                    ph[e.phase] += e.dur
            measured = sum(ph.values())
            ph["python"] = (s1 - s0) - measured
            rows.append((str(i),) + tuple(f"{ph[p]:.4f}" for p in PHASES)
                        + (f"{measured:.4f}", f"{s1 - s0:.4f}"))
            for p in PHASES:
                sums[p] += ph[p]
            walls += s1 - s0
        measured = sum(v for k, v in sums.items() if k != "python")
        rows.append(("all",) + tuple(f"{sums[p]:.4f}" for p in PHASES)
                    + (f"{measured:.4f}", f"{walls:.4f}"))
        head = ("step",) + PHASES + ("measured", "wall")
        return ProfileTable("phases (s)", head, rows, "", [],
                            totals=dict(sums, measured=measured, wall=walls))

    # -- the trace file

    def trace_events(self) -> list[dict]:
        """Chrome trace events (``ph: X``, microseconds from the profile's start)."""
        pid = os.getpid()
        us = lambda t: round((t - self.t0) * 1e6, 3)  # noqa: E731
        ev = [{"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
               "args": {"name": "xlanb"}}]
        for e in self.ops:
            ev.append({"name": e.name, "cat": "op", "ph": "X", "ts": us(e.start),
                       "dur": round(e.dur * 1e6, 3), "pid": pid, "tid": self._tid,
                       "args": {"scope": e.scope, "line": format_loc(e.src),
                                "file": e.src.file if e.src else "",
                                "self_us": round(e.self_s * 1e6, 3)}})
        ev += self._scope_slices(us)
        for e in self.phase_events:
            ev.append({"name": e.name, "cat": e.phase or "background", "ph": "X",
                       "ts": us(e.start), "dur": round(e.dur * 1e6, 3), "pid": pid,
                       "tid": e.tid, "args": {"line": format_loc(e.src), "scope": e.scope}})
        ev += self._compile_slices(us)
        for i, (s0, s1) in enumerate(self.steps):
            ev.append({"name": f"step {i}", "cat": "step", "ph": "X", "ts": us(s0),
                       "dur": round((s1 - s0) * 1e6, 3), "pid": pid, "tid": 0})
        ev.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": 0,
                   "args": {"name": "steps"}})
        return ev + self._jax_events()

    def _compile_slices(self, us) -> list[dict]:
        """Each graph compiled while the profile recorded, as a slice ``compile graph
        <hash>`` on the thread that compiled it (inside its ``CompileTime`` sample), with
        the compile's phases nested under it (``graphs()[i].compile_profile``): xlanb's
        lowering, then XLA's own spans where they were traced (the HLO pass pipelines,
        ``CpuCompiler::RunBackend``, ``Codegen``, each fusion's emitter), at the times
        XLA measured; else the profile's parts one after another, each as long as
        measured (the args say so)."""
        out: list[dict] = []
        pid = os.getpid()
        threads: dict = {}  # XLA's other compile threads -> their tid here
        for g in list(graph_log):
            raw = g._compile_raw
            if raw is None or not self.t0 <= raw.perf_started <= (self.t1 or time.perf_counter()):
                continue
            if g._exe is None and g._compile_profile is None:
                continue  # reading its module would load a dropped executable again
            t1 = raw.perf_started
            t2 = t1 + raw.compile_s
            around = [e for e in self.phase_events if e.phase == "compile" or
                      e.name.endswith("CompileTime")]
            around = [e for e in around if e.start <= t1 and t2 <= e.start + e.dur]
            tid = min(around, key=lambda e: e.dur).tid if around else self._tid
            prof = g.compile_profile

            def slice_(name, cat, start, dur, args, on=tid):
                out.append({"name": name, "cat": cat, "ph": "X", "ts": us(start),
                            "dur": round(max(dur, 0.0) * 1e6, 3), "pid": pid, "tid": on,
                            "args": args})

            slice_(f"compile graph {format_hash(g.hash)}", "compile", t1 - raw.lower_s,
                   raw.lower_s + raw.compile_s,
                   {"graph": g.hash, "slowest line": prof.short(),
                    "phases": {k: round(v, 6) for k, v in prof.phases().items()},
                    "advice": [a.text for a in prof.advice]})
            slice_("xlanb's trace and lowering", "compile phase", t1 - raw.lower_s,
                   raw.lower_s, {"measured by": "xlanb's timer"})
            if raw.spans:
                # the spans of XLA's thread that ran the compile nest under it; a span of
                # another of its threads (parallel codegen) goes on a thread of its own
                main = next((sp.line for sp in raw.spans
                             if sp.name == "PjRtCpuClient::Compile"), raw.spans[0].line)
                for sp in raw.spans:  # ns from the profiler session's start (= t1)
                    a = max(t1 + sp.start * 1e-9, t1)
                    b = min(t1 + sp.end * 1e-9, t2)
                    if b <= a:
                        continue
                    if sp.line != main and sp.line not in threads:
                        threads[sp.line] = _XLA_TID + len(threads)
                        out.append({"name": "thread_name", "ph": "M", "pid": pid,
                                    "tid": threads[sp.line],
                                    "args": {"name": f"XLA compile ({sp.line})"}})
                    slice_(sp.name, "compile phase", a, b - a,
                           {k: str(v) for k, v in sp.args.items()},
                           tid if sp.line == main else threads[sp.line])
                continue
            at = t1
            for part in prof.parts:
                if part.phase == "lowering" or at >= t2:
                    continue
                dur = min(part.seconds, t2 - at)
                slice_(part.name, "compile phase", at, dur,
                       {"phase": part.phase, "measured by": part.how,
                        "placed": "in order, as long as measured (no span timed it)"})
                at += dur
        return out

    def _scope_slices(self, us) -> list[dict]:
        """Module scopes as slices around their ops, nested as the modules were (as
        PyTorch's profiler does with ``with_modules``): a trace viewer, which shows
        names, reads ``Net`` > ``Net.encoder`` > ``Net.encoder.0`` > ``aten::addmm``.
        A scope's slice spans its consecutive ops within one step."""
        out: list[dict] = []
        pid = os.getpid()
        stack: list[list] = []  # [scope path, start, end], outermost first

        def close(depth: int) -> None:
            while len(stack) > depth:
                name, t0, t1 = stack.pop()
                out.append({"name": name, "cat": "module", "ph": "X", "ts": us(t0),
                            "dur": round((t1 - t0) * 1e6, 3), "pid": pid, "tid": self._tid,
                            "args": {"scope": name}})

        step = None
        for e in sorted(self.ops, key=lambda e: e.start):
            if e.step != step:
                close(0)
                step = e.step
            parts = e.scope.split(".") if e.scope else []
            paths = [".".join(parts[:i + 1]) for i in range(len(parts))]
            same = 0
            while same < min(len(stack), len(paths)) and stack[same][0] == paths[same]:
                same += 1
            close(same)
            for path in paths[same:]:
                stack.append([path, e.start, e.start])
            for frame in stack:
                frame[2] = max(frame[2], e.start + e.dur)
        close(0)
        return out

    def _raw_jax_events(self) -> list[dict]:
        """JAX's trace events as its profiler wrote them ([] without device=True)."""
        if not self._jax_dir:
            return []
        found = [os.path.join(d, f) for d, _, fs in os.walk(self._jax_dir) for f in fs
                 if f.endswith(".trace.json.gz")]
        if not found:
            return []
        with gzip.open(found[0]) as f:
            data = json.load(f)
        return data["traceEvents"] if isinstance(data, dict) else data

    def _jax_events(self) -> list[dict]:
        """JAX's events, as the Chrome/Perfetto format wants them: on the profile's clock,
        every one with ``ph`` and integer ``pid``/``tid`` (JAX's closing ``{}`` dropped),
        JAX's processes apart from xlanb's (another pid where JAX's equals this process's)
        and each named ``JAX <its name>`` by a ``process_name`` event."""
        shift = (self._jax_t0 - self.t0) * 1e6  # JAX's clock starts at its start_trace
        names: dict = {}  # (module, instruction) -> what the user calls it
        modules = {rec.module for rec in graph_log if rec.module}
        for module, instr, op, scope, src, _ in self.device_instrs:
            names[(module, instr)] = (op, scope, src)
        raw = [e for e in self._raw_jax_events() if isinstance(e, dict) and e.get("ph")]
        ours = os.getpid()
        taken = {e["pid"] for e in raw if isinstance(e.get("pid"), int)} | {ours}
        pids: dict = {}  # JAX's pid -> the trace's

        def pid_of(p) -> int:
            if p not in pids:
                if isinstance(p, int) and not isinstance(p, bool) and p != ours:
                    pids[p] = p
                else:
                    fresh = max(taken) + 1
                    taken.add(fresh)
                    pids[p] = fresh
            return pids[p]

        out = []
        named: set = set()
        for e in raw:
            e = dict(e)
            if "ts" in e:
                e["ts"] = round(e["ts"] + shift, 3)
            e["pid"] = pid_of(e.get("pid"))
            if not isinstance(e.get("tid"), int):
                e["tid"] = 0
            if e["ph"] == "M" and e.get("name") == "process_name":
                e["args"] = {**(e.get("args") or {}),
                             "name": f"JAX {(e.get('args') or {}).get('name', '')}".strip()}
                named.add(e["pid"])
            a = e.get("args")
            if a and "hlo_op" in a:
                user = names.get((a.get("hlo_module", ""), a["hlo_op"]))
                if user is not None:  # an instruction of a profiled graph: its user name
                    op, scope, src = user
                    e["name"] = f"{op} {scope}".strip()
                    e["args"] = dict(a, aten_op=op, scope=scope, line=format_loc(src))
                elif a.get("hlo_module") in modules:
                    e["args"] = dict(a, graph=a["hlo_module"])
            out.append(e)
        for pid in sorted(set(pids.values()) - named):
            out.append({"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
                        "args": {"name": "JAX"}})
        return out

    def export(self, path: str) -> str:
        """Write a Chrome/Perfetto trace (``.json`` or ``.json.gz``): xlanb's ops with
        their scope and line, its phases, the steps, and JAX's events when profiled with
        ``device=True``. Open it at ui.perfetto.dev or chrome://tracing."""
        data = {"traceEvents": self.trace_events(), "displayTimeUnit": "ms",
                "otherData": {"tool": "xlanb.profile", "wall_s": self.wall}}
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "wt") as f:
            json.dump(data, f)
        return path

    def close(self) -> None:
        """Drop the profiled graphs (they hold device buffers) and JAX's trace files."""
        self.graphs.clear()
        if self._jax_dir:
            shutil.rmtree(self._jax_dir, ignore_errors=True)

    # -- display

    def _views(self) -> tuple[list, list[str]]:
        """The four tables without their notes, and the notes once each, in order."""
        tables = [self.phases(), self.by_scope(10), self.by_line(10), self.by_op(10)]
        notes: list[str] = []
        for t in tables:
            notes += [n for n in t.note.split("\n") if n and n not in notes]
            t.note = ""
        return tables, notes

    def __str__(self) -> str:
        tables, notes = self._views()
        return "\n\n".join([str(t) for t in tables]
                           + (["\n".join(f"({n})" for n in notes)] if notes else []))

    __repr__ = __str__

    def _repr_html_(self) -> str:
        tables, notes = self._views()
        return ("<div class='xlanb-profile'>" + icicle_svg(self)
                + "".join(t._repr_html_() for t in tables)
                + "".join(f"<p><i>{html.escape(n)}</i></p>" for n in notes) + "</div>")


class ProfileTable:
    """One view of a profile: text in a terminal, HTML in a notebook; ``.rows`` are
    tuples of strings, ``.keys`` the SourceLoc / scope / op of each row."""

    def __init__(self, title, head, rows, note, keys, totals=None):
        self.title, self.head, self.rows, self.note, self.keys = title, head, rows, note, keys
        self.totals = totals or {}

    def __str__(self) -> str:
        text = f"{self.title}\n" + format_table(self.head, self.rows,
                                                  right=tuple(range(1, len(self.head))))
        return text + "".join(f"\n({n})" for n in self.note.split("\n") if n)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        # names left, numbers right: Jupyter right-aligns every cell unless told
        table = format_table_html(self.head, self.rows, right=tuple(range(1, len(self.head))),
                                  cls="xlanb-profile-table")
        note = "".join(f"<p><i>{html.escape(n)}</i></p>" for n in self.note.split("\n") if n)
        return f"<h4>{html.escape(self.title)}</h4>{table}{note}"


def icicle_svg(p: Profile, width: int = 900, row_h: int = 18) -> str:
    """An icicle chart of total time by module scope: the top bar is everything the
    profile's ops took, each scope sits under its parent, as wide as its share."""
    flat = p._rows(lambda src, scope, name: scope)
    tree: dict = {}
    for scope, (_calls, _self, total, rep) in flat.items():
        node = tree
        node.setdefault("", 0.0)
        node[""] = node.get("", 0.0) + total + rep
        for part in (scope.split(".") if scope else []):
            node = node.setdefault(part, {})
            node[""] = node.get("", 0.0) + total + rep
    # the ops outside every module (the optimizer, the loop's own lines, a lazy graph's
    # run at the line that synced) get a bar of their own under the top one: without it
    # the row under "all ops" was as empty as their share
    outside = sum(total + rep for scope, (_c, _s, total, rep) in flat.items() if not scope)
    if outside:
        tree["(top level)"] = {"": outside}
    top = tree.get("", 0.0) or 1.0
    rects = []
    depth_max = [0]

    def draw(node, name, x, depth, path):
        w = width * node[""] / top
        if w < 1:
            return
        depth_max[0] = max(depth_max[0], depth)
        y = depth * row_h
        hue = (hash(path) % 360) if path else 210
        label = html.escape(name) if w > 7 * len(name) else ""
        rects.append(f'<g><title>{html.escape(path or "all")}: {node[""]:.4f} s</title>'
                     f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{row_h - 1}" '
                     f'fill="hsl({hue},55%,75%)"/><text x="{x + 3:.1f}" y="{y + row_h - 5}" '
                     f'font-size="11" font-family="Helvetica">{label}</text></g>')
        cx = x
        for child, sub in sorted(((k, v) for k, v in node.items() if k),
                                 key=lambda kv: -kv[1][""]):
            draw(sub, child, cx, depth + 1, f"{path}.{child}" if path else child)
            cx += width * sub[""] / top

    draw(tree, "all ops", 0.0, 0, "")
    h = (depth_max[0] + 1) * row_h
    return (f'<svg xmlns="http://www.w3.org/2000/svg" class="xlanb-icicle" width="{width}" '
            f'height="{h}" viewBox="0 0 {width} {h}">' + "".join(rects) + "</svg>")


def profile(device: bool = False, replay: bool = False) -> Profile:
    """``with xlanb.profile() as p:`` records where the block's time goes: ``p.by_line()``,
    ``p.by_scope()``, ``p.by_op()``, ``p.phases()``, ``p.export("trace.json.gz")``.
    ``device=True`` also runs ``jax.profiler`` and merges its events into the export;
    ``replay=True`` estimates per-op device time of lazy graphs (see ``Profile.replay``)."""
    return Profile(device=device, replay=replay)


__all__ = ["profile", "Profile", "ProfileTable"]
