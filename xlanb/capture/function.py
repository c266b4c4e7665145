"""``xlanb.compile``: trace a step function, then replay its executable without Python.

Lazy mode re-runs the Python function on every call, recording the graph again and
hashing it to find the executable. A compiled function does that only until the trace
is known to be stable, then calls the executable directly on the tensors' current values:

1. Calls are traced in lazy mode, with pending work synced before the call so that the
   graph holds exactly the function's work. The function's end is its sync point.
2. Two consecutive traces with the same graph, the same state tensors, the same Python
   scalars and the same host constants make the trace *stable*. Python state is only
   seen by running Python, so this check is the guard: a learning rate or an optimizer
   step count kept on the host changes between calls and keeps the function on lazy
   tracing, with the reason (the op and source line that read it) in ``fn.status()``.
3. A stable trace replays: its inputs are read from the same state tensors (parameters,
   gradients, optimizer state) and the call's tensor arguments, random ops get fresh
   keys, and the results are written back into the tensors the function wrote.

A function that cannot be captured (it reads a device value on the host, or its graph
keeps changing) runs as lazy tracing, and says why. Replays run the graph that
``xlanb.graphs()`` lists with cause ``xlanb.compile(<name>)``.
"""
from __future__ import annotations

import functools
import warnings
import weakref

import numpy as np
import torch
from torch.utils import _pytree as pytree

from ..base import metrics, rng
from ..base.config import config
from ..base.formats import format_hash
from ..base.frames import format_loc, user_frame
from ..base.session import session
from ..values.checks import bad_indices, index_error, take_index_checks, without_failed
from ..execute.graphs import find_graph, run_cached
from ..execute.nans import check_run
from ..graph.explain import explain
from ..graph.summary import summarize
from ..ir.nodes import Node, TensorMeta, contiguous_strides
from ..pending.live import clear_peeks, live_storages, pending_roots
from ..modes.switch import mode as _mode
from ..ops.leaves import data_info
from ..pending.realize import node_array, placed, run_checked, sync
from ..runtime.mesh import common_mesh, on_mesh
from ..modes.record import value_node
from ..ir.tensor import XlaTensor, new_tensor

#: Traces compared before giving up on a function whose graph or scalars keep changing.
MAX_TRACES = 4



class _Recorder:
    """Collected while a call is traced: where each leaf (device data) came from."""

    def __init__(self, name: str):
        self.name = name
        self.sources: dict[int, tuple] = {}  # id(leaf node) -> ("storage"|"tensor", weakref)
        self.broken: str | None = None

    def saw(self, tensors) -> None:
        src = self.sources
        for t in tensors:
            node = t._storage.node
            if node.data is not None and id(node) not in src:
                src[id(node)] = ("storage", weakref.ref(t._storage))
            vnode = t._node
            if t._view and vnode is not None and vnode.data is not None and id(vnode) not in src:
                src[id(vnode)] = ("tensor", weakref.ref(t))

    def host_read(self, cause: str) -> None:
        # The read goes ahead (the call goes on as lazy tracing); only the first is named.
        if self.broken is None:
            src = user_frame()
            where = f" at {format_loc(src)}" if src else ""  # In[5]:3 in a notebook
            self.broken = f"reads a device value on the host ({cause}){where}"


class _Trace:
    """One traced call: the graph, where its leaves come from, where its roots go."""

    def __init__(self, plan, device, sources, scalars, key_pos, dests, out_spec, out_roots,
                 checks):
        self.plan = plan
        self.key = plan.key
        self.device = device
        self.sources = sources      # per leaf: ("arg", i) | ("storage"|"tensor", ref) | ("const", arr)
        self.scalars = scalars      # lifted scalars, random keys included
        self.key_pos = key_pos      # positions of random keys among the scalars
        self.dests = dests          # per root: [weakref(storage)] written with its value
        self.out_spec = out_spec    # pytree spec of the function's result
        self.out_roots = out_roots  # per result leaf: root index, or ("py", value)
        self.checks = checks        # IndexChecks whose ranges the plan's last root holds, if any
        self.blocker = None         # why this trace can never replay, if it cannot
        self.placed = None          # SPMD: per root, where the value it replaces lay

    def difference(self, other: "_Trace") -> str | None:
        """Why ``other`` cannot be replayed as this trace (None: it can)."""
        if other.blocker:
            return other.blocker
        if self.key != other.key:
            why = explain(summarize(self.plan), summarize(other.plan))
            return f"the graph changed between calls: {why or 'different structure'}"
        for i, (a, b) in enumerate(zip(self.sources, other.sources)):
            if a[0] != b[0]:
                return f"input {i} of the graph comes from a different place between calls"
            if a[0] in ("storage", "tensor") and a[1]() is not b[1]():
                return f"input {i} of the graph is a different tensor between calls"
            if a[0] == "const" and not np.array_equal(np.asarray(a[1]), np.asarray(b[1])):
                return ("a host value copied to the device inside the function changes "
                        "between calls; pass it as a tensor argument")
        skip = set(self.key_pos)
        for i, (a, b) in enumerate(zip(self.scalars, other.scalars)):
            if i not in skip and not _same_scalar(a, b):
                return (f"a Python number changes between calls ({_fmt(a)} -> {_fmt(b)}), "
                        f"read by {self._scalar_user(i)}; keep it on the device (e.g. "
                        "torch.optim's capturable=True) or pass it as a tensor argument")
        if self.out_spec != other.out_spec or self.out_roots != other.out_roots:
            return "the function's result has a different structure between calls"
        return None

    def _scalar_user(self, i: int) -> str:
        k = 0
        for (info, _), node in zip(self.plan.steps, self.plan.op_nodes):
            n = len(info.scalar_specs)
            if k <= i < k + n:
                where = format_loc(node.src) or "?"
                return f"{info.name} at {where}"
            k += n
        return "an op"


def _same_scalar(a, b) -> bool:
    return np.array_equal(np.asarray(a), np.asarray(b))


def _fmt(v) -> str:
    if isinstance(v, np.float32):  # a lifted float passed as float32: its shortest form
        return str(v)
    a = np.asarray(v)
    return repr(a.item()) if a.size == 1 else f"array{a.shape}"


class _Entry:
    """The state of one guard key (argument signature) of a compiled function."""

    def __init__(self):
        self.traces: list[_Trace] = []
        self.replay: _Trace | None = None
        self.record = None        # the CompiledGraph replays run
        self.lazy_reason: str | None = None


class CompiledFunction:
    """What ``xlanb.compile(fn)`` returns; call it like ``fn``."""

    def __init__(self, fn, name: str | None = None):
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.name = name or getattr(fn, "__qualname__", None) or repr(fn)
        self._entries: dict = {}
        self.replays = 0
        self.traced_calls = 0

    def __call__(self, *args, **kwargs):
        __debuggerskip__ = True  # IPython's debugger steps over xlanb frames
        flat, spec = pytree.tree_flatten((args, kwargs))
        # with each input's storage offset: a view the function returns lies at one
        key = (spec, tuple((x._key, x._meta.offset) if isinstance(x, XlaTensor) else
                           ("T", x.device, x.dtype, tuple(x.shape)) if isinstance(x, torch.Tensor)
                           else _static(x) for x in flat))
        entry = self._entries.get(key)
        if entry is None:
            entry = self._entries[key] = _Entry()
        if entry.replay is not None:
            res = _replay(self, entry, flat)
            if res is not _MISS:
                return res
        if entry.lazy_reason is not None or session.recorder is not None:
            return self._lazy_call(args, kwargs)  # (a compiled function called by another)
        return self._traced_call(entry, args, kwargs, flat)

    def status(self) -> str:
        """One line per argument signature: replaying, tracing, or lazy (with the reason)."""
        lines = [f"xlanb.compile({self.name}): {self.traced_calls} traced calls, "
                 f"{self.replays} replays"]
        for i, e in enumerate(self._entries.values()):
            if e.replay is not None:
                state = f"replaying graph {format_hash(e.record.hash)}" if e.record else "replaying"
            elif e.lazy_reason:
                state = f"lazy tracing: {e.lazy_reason}"
            else:
                state = f"tracing ({len(e.traces)} traces so far)"
            lines.append(f"  signature #{i}: {state}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"<xlanb.compile({self.name})>"

    # -- calls that run Python ----------------------------------------------------------

    def _lazy_call(self, args, kwargs):
        with _mode("lazy"):
            out = self.fn(*args, **kwargs)
            sync(cause=f"xlanb.compile({self.name}) on lazy tracing")
        return out

    def _traced_call(self, entry: _Entry, args, kwargs, flat):
        self.traced_calls += 1
        cause = f"xlanb.compile({self.name})"
        with _mode("lazy"):
            sync(cause=f"pending work before {cause}")
            rec = _Recorder(self.name)
            session.recorder = rec
            try:
                out = self.fn(*args, **kwargs)
            finally:
                session.recorder = None
            if rec.broken:
                sync(cause=cause)
                entry.lazy_reason = rec.broken
                entry.traces = []
                _warn(self.name, rec.broken)
                return out
            trace = _finish(rec, flat, out, cause)
        if trace is None:
            return out
        prev = entry.traces[-1] if entry.traces else None
        entry.traces.append(trace)
        if prev is not None:
            why = prev.difference(trace)
            if why is None:
                entry.replay = trace
                entry.record = _graph(trace, cause)
                entry.traces = [trace]
            elif len(entry.traces) >= MAX_TRACES:
                entry.lazy_reason = why
                entry.traces = []
                _warn(self.name, why)
        return out


class _Miss:
    pass


_MISS = _Miss()


def _static(x):
    try:
        hash(x)
        return ("S", type(x), x)  # typed: True == 1 == 1.0, but a function may tell them apart
    except TypeError:
        return ("R", repr(x))


def _warn(name: str, why: str) -> None:
    warnings.warn(f"xlanb.compile({name}) stays on lazy tracing: {why}", UserWarning, stacklevel=4)


def _finish(rec: _Recorder, flat_in, out, cause: str):
    """Sync the traced call as one graph and describe it as a replayable _Trace."""
    storages = live_storages()
    out_flat, out_spec = pytree.tree_flatten(out)
    out_nodes = [value_node(o) if isinstance(o, XlaTensor) else None for o in out_flat]
    roots: list[Node] = []
    root_of: dict[int, int] = {}
    # a tensor left failed by an earlier index check stays pending (its reads raise);
    # the call's own results are run, and raise if computed from one
    written = without_failed([s.node for s in storages if s.node.data is None])
    for n in written + [n for n in out_nodes if n is not None]:
        if n.data is None and id(n) not in root_of:
            root_of[id(n)] = len(roots)
            roots.append(n)
    if not roots:
        return None
    devices = {r.info.device for r in roots}
    if len(devices) != 1:
        return None  # several devices: run as lazy tracing did (already synced below)
    device = devices.pop()
    src = user_frame()
    # the call's index checks (all pending ones: the call started with none), compiled
    # into its graph so that every replay checks its own indices
    checks = take_index_checks(device)
    plan, arrays = run_checked(roots, checks, device, "compiled", cause, src)
    where = placed(plan.roots)  # SPMD: where the values it replaces lay
    for node, arr in zip(plan.roots, arrays):
        node.materialize(arr)
    clear_peeks()
    # Where the leaves come from: a tensor argument, a state tensor, or a host constant.
    arg_storage = {id(x._storage): i for i, x in enumerate(flat_in) if isinstance(x, XlaTensor)
                   and not x._view}
    sources = []
    for leaf in plan.leaves:
        src = rec.sources.get(id(leaf))
        if src is None:
            sources.append(("const", leaf.data))
        elif src[0] == "storage" and id(src[1]()) in arg_storage:
            sources.append(("arg", arg_storage[id(src[1]())]))
        else:
            sources.append(src)
    dests: list[list] = [[] for _ in roots]
    for s in storages:
        i = root_of.get(id(s.node))
        if i is not None:
            dests[i].append(weakref.ref(s))
    out_roots = tuple(root_of[id(n)] if n is not None and id(n) in root_of else ("py", o)
                      for n, o in zip(out_nodes, out_flat))
    key_pos = []
    k = 0
    for info, _ in plan.steps:
        for spec in info.scalar_specs:
            if spec == "key":
                key_pos.append(k)
            k += 1
    trace = _Trace(plan, device, sources, list(plan.scalars), key_pos, dests, out_spec, out_roots,
                   [c for c, _ in checks])
    trace.placed = where
    if any(isinstance(r, tuple) and isinstance(r[1], XlaTensor) for r in out_roots):
        trace.blocker = "it returns a tensor that it did not compute"
    return trace


def _graph(trace: _Trace, cause: str):
    # the graph the traced call ran: on a mesh, for its leaves' shardings
    rec, _, _ = find_graph(trace.plan, trace.device, cause, None, trace.placed)
    return rec


def _replay(cf: CompiledFunction, entry: _Entry, flat_in):
    """Run the stable trace on current values; _MISS if a state tensor is gone."""
    trace = entry.replay
    if pending_roots():
        sync(cause=f"pending work before xlanb.compile({cf.name})")
    leaves = []
    for kind, ref in trace.sources:
        if kind == "arg":
            t = flat_in[ref]
            leaves.append(node_array(value_node(t)))
        elif kind == "const":
            leaves.append(ref)
        else:
            obj = ref()
            if obj is None:
                entry.replay = None  # a state tensor died: trace again
                return _MISS
            node = obj.node if kind == "storage" else value_node(obj)
            leaves.append(node.data if node.data is not None else node_array(node))
    want = entry.record.in_shardings
    if want is not None or session.spmd:  # SPMD: the leaves must lie as the graph expects
        mesh = common_mesh(want or ())
        if mesh is not None:
            leaves = [a if isinstance(a, tuple) else on_mesh(a, mesh) for a in leaves]
        got = tuple(getattr(a, "sharding", None) for a in leaves)
        if want is None and any(s is not None and len(s.device_set) > 1 for s in got) or \
                want is not None and got != want:
            entry.replay = None  # another sharding: trace again (compiled once per sharding)
            return _MISS
    scalars = list(trace.scalars)
    for p in trace.key_pos:
        scalars[p] = rng.next_key()
    src = user_frame()
    # through the graph's one rule for a run that came back: a quick executable tiers up
    # at a fixed run, as a lazy graph's does (replays of the quick one ran the BERT step
    # 2-3x slower for good)
    outs = run_cached(entry.record, leaves, scalars, f"xlanb.compile({cf.name})'s graph "
                      f"replayed at {format_loc(src) or '?'}", src)
    metrics.counter("CompiledReplay")
    cf.replays += 1
    bad = bad_indices(trace.checks, outs[-1]) if trace.checks else ()
    if bad:  # before any state tensor is written: a bad index leaves them as they were
        raise index_error(*bad[0], f"found by the index check compiled into "
                          f"xlanb.compile({cf.name})'s graph; no tensor was written")
    if config.debug_nans:  # before any state tensor is written: a NaN leaves them as they were
        check_run(trace.plan, outs, "compiled", f"xlanb.compile({cf.name}) replay",
                  src, leaves=leaves, scalars=scalars)
    for arr, dest in zip(outs, trace.dests):
        for ref in dest:
            s = ref()
            if s is not None:
                s.node = Node(data_info(s.meta, s.device), data=arr)
                s.version += 1
    res = []
    for r in trace.out_roots:
        if isinstance(r, int):
            m = trace.plan.roots[r].info.out  # a view's meta: the result is a fresh base
            meta = TensorMeta(m.shape, contiguous_strides(m.shape), m.dtype)
            res.append(new_tensor(Node(data_info(meta, trace.device), data=outs[r]), meta,
                                  trace.device))
        else:
            res.append(r[1])
    return pytree.tree_unflatten(res, trace.out_spec)


def compile(fn=None, *, name: str | None = None):
    """Trace ``fn`` (a training or eval step) and replay its executable once the trace
    is stable. Usable as ``xlanb.compile(fn)`` or as a decorator, with or without
    arguments. See ``CompiledFunction.status()`` for what each argument signature does."""
    if fn is None:
        return lambda f: CompiledFunction(f, name)
    return CompiledFunction(fn, name)
