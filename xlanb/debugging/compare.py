"""``xlanb.compare_cpu``: run one function on the xla device (op by op, eager) and on CPU
torch from the same inputs, pair the aten ops as both sides dispatch them, and report
each op's error: the first op beyond tolerance is where the two diverge.

Both sides run under the same torch dispatch mode, which records each aten op's name,
the user's line, the module scope and a snapshot of its outputs (CPU: a clone; xla: the
device array the op just made, in eager mode, so later in-place writes do not change it).
The two op sequences are aligned by name (``difflib``), so an op one side runs and the
other does not shifts nothing after it.
"""
from __future__ import annotations

import copy
import difflib
from typing import NamedTuple

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves, tree_map

from ..base.config import config
from ..base.frames import SourceLoc, format_loc, user_frame
from ..base.scopes import current_scope
from ..base.formats import format_table
from ..graph.render import render_dot
from ..graph.summary import GraphSummary, OpRecord, aval_text
from ..modes.switch import get_mode, set_mode
from ..modes.record import value_node
from ..ir.tensor import XlaTensor


class CompareRow(NamedTuple):
    """One op of the comparison."""
    index: int
    op: str                  # aten::addmm
    scope: str
    src: SourceLoc | None
    shape: tuple
    dtype: str               # the xla side's dtype
    max_abs: float           # max |xla - cpu| over the op's outputs (nan: not comparable)
    max_rel: float           # max |xla - cpu| / |cpu|
    ok: bool                 # within rtol/atol (NaN == NaN)
    note: str = ""           # "only on cpu", "only on xla", "shape differs"


class CompareReport:
    """``xlanb.compare_cpu``'s result: ``.rows`` (one CompareRow per op) and
    ``.first_divergence`` (the first row beyond tolerance, or None)."""

    _COLUMNS = ("#", "op", "shape", "dtype", "max abs", "max rel", "", "scope", "source")

    def __init__(self, rows: list, rtol: float, atol: float, graph: GraphSummary | None = None,
                 row_of_op: dict | None = None):
        self.rows = rows
        self.rtol = rtol
        self.atol = atol
        self.first_divergence = next((r for r in rows if not r.ok), None)
        # the xla side's ops as a graph (GraphSummary), and each graph op's row
        self.graph = graph
        self._row_of_op = row_of_op or {}

    def to_dot(self) -> str:
        """The xla side's ops as a graph (DOT), coloured by error: red for the first op
        beyond tolerance, pink for later ones, green within it."""
        if self.graph is None:
            return ""
        first = self.first_divergence
        n_in = len(self.graph.inputs)
        marks = {}
        for j, i in self._row_of_op.items():
            r = self.rows[i]
            marks[n_in + j] = ("#ff6b6b" if r is first else "#ffd0d0" if not r.ok
                               else "#d8f5d0")
        return render_dot(self.graph, marks=marks)

    def _repr_svg_(self) -> str | None:
        """The coloured graph as SVG, when Graphviz's ``dot`` is installed."""
        from ..graph.render import render_svg
        try:
            return render_svg(self.to_dot()) if self.graph is not None else None
        except (RuntimeError, OSError):
            return None

    def _cells(self):
        first = self.first_divergence
        for r in self.rows:
            mark = "<- first divergence" if r is first else ("x" if not r.ok else "")
            yield (str(r.index), r.op, "x".join(map(str, r.shape)) or "()", r.dtype,
                   f"{r.max_abs:.3g}", f"{r.max_rel:.3g}", mark + (f" {r.note}" if r.note else ""),
                   r.scope, format_loc(r.src))

    def __str__(self) -> str:
        head = (f"compare_cpu: {len(self.rows)} ops, rtol={self.rtol}, atol={self.atol}; "
                + (f"first divergence: op {self.first_divergence.index} "
                   f"{self.first_divergence.op} at {format_loc(self.first_divergence.src)}"
                   if self.first_divergence else "all within tolerance"))
        return head + "\n" + format_table(self._COLUMNS, list(self._cells()), right=(0, 4, 5))

    __repr__ = __str__

    def _repr_html_(self) -> str:
        import html
        head = "".join(f"<th>{html.escape(c)}</th>" for c in self._COLUMNS)
        body = []
        for r, cells in zip(self.rows, self._cells()):
            style = " style='background:#fdd'" if not r.ok else ""
            body.append(f"<tr{style}>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells)
                        + "</tr>")
        table = f"<table class='xlanb-compare'><tr>{head}</tr>{''.join(body)}</table>"
        svg = self._repr_svg_()
        return f"<div><pre>{html.escape(str(self).splitlines()[0])}</pre>{table}" \
            + (f"<div class='xlanb-compare-graph'>{svg}</div>" if svg else "") + "</div>"


class _Record(TorchDispatchMode):
    def __init__(self, xla: bool):
        super().__init__()
        self.xla = xla
        self.ops: list = []
        # xla side: which op made each value (id of its node -> op index, output index),
        # the leaves read (id of node -> leaf position, with their avals), each op's inputs
        self.made: dict = {}
        self.leaves: dict = {}
        self.leaf_avals: list = []
        self.ins: list = []
        self.avals: list = []  # xla side: each op's result type (f32[8,16])

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        ins = self._inputs(args, kwargs) if self.xla else ()
        out = func(*args, **(kwargs or {}))
        snaps = []
        avals = []
        for t in tree_leaves(out):
            if not isinstance(t, torch.Tensor):
                continue
            if self.xla:
                if type(t) is XlaTensor:
                    node = value_node(t)
                    self.made[id(node)] = (len(self.ops), len(snaps))
                    snaps.append((node, t._meta.dtype))
                    avals.append(aval_text(t._meta))
            else:
                snaps.append(t.detach().clone())
        self.ins.append(ins)
        self.avals.append(", ".join(avals))
        self.ops.append((func._schema.name, user_frame(), current_scope(), snaps))
        return out

    def _inputs(self, args, kwargs) -> tuple:
        """Each xla tensor argument as ("op", index) or ("leaf", position)."""
        ins = []
        for t in tree_leaves((args, kwargs)):
            if type(t) is not XlaTensor:
                continue
            node = value_node(t)
            made = self.made.get(id(node))
            if made is not None:
                ins.append(("op", made[0]))
                continue
            pos = self.leaves.get(id(node))
            if pos is None:
                pos = self.leaves[id(node)] = len(self.leaf_avals)
                self.leaf_avals.append((aval_text(t._meta), node))  # node: keeps the id
            ins.append(("leaf", pos))
        return tuple(ins)

    def summary(self) -> GraphSummary:
        """The recorded xla ops as a GraphSummary (positions: leaves first, then ops)."""
        n_in = len(self.leaf_avals)
        ops = []
        for (name, src, scope, _snaps), ins, aval in zip(self.ops, self.ins, self.avals):
            pos = tuple(p if kind == "leaf" else n_in + p for kind, p in ins)
            call = ", ".join(f"%{p}" for p in pos)
            ops.append(OpRecord(name, aval, call, src, scope, pos, call))
        read = {p for op in ops for p in op.ins}
        outputs = tuple(n_in + j for j in range(len(ops)) if n_in + j not in read)
        return GraphSummary(tuple(a for a, _ in self.leaf_avals), tuple(ops), outputs)


def _host(snap) -> np.ndarray:
    if isinstance(snap, torch.Tensor):
        t = snap
        if t.dtype == torch.bfloat16 or t.dtype == torch.float16:
            t = t.float()
        return t.numpy() if not t.is_complex() else t.resolve_conj().numpy()
    node, _dtype = snap
    return np.asarray(node.data).astype(np.float64) if np.asarray(node.data).dtype.kind == "V" \
        else np.asarray(node.data)


def _errors(x: np.ndarray, c: np.ndarray, rtol: float, atol: float):
    if x.shape != c.shape:
        return float("nan"), float("nan"), False, "shape differs"
    if x.dtype == bool or c.dtype == bool:
        x, c = x.astype(np.int64), c.astype(np.int64)
    x = x.astype(np.complex128 if x.dtype.kind == "c" else np.float64)
    c = c.astype(np.complex128 if c.dtype.kind == "c" else np.float64)
    if x.size == 0:
        return 0.0, 0.0, True, ""
    both_nan = np.isnan(x) & np.isnan(c)
    same_inf = np.isinf(x) & (x == c)
    diff = np.where(both_nan | same_inf, 0.0, np.abs(x - c))
    rel = diff / np.maximum(np.abs(c), np.finfo(np.float64).tiny)
    ok = bool(np.all(diff <= atol + rtol * np.abs(np.where(np.isfinite(c), c, 0))))
    return float(np.nanmax(diff)) if diff.size else 0.0, float(np.nanmax(rel)), ok, ""


def compare_cpu(fn, *args, rtol: float = 1e-5, atol: float = 1e-6, xla_dtype=None,
                **kwargs) -> CompareReport:
    """Run ``fn(*args, **kwargs)`` on CPU torch and on the xla device (eager: op by op),
    from the same inputs, and compare every aten op's outputs.

    ``args``/``kwargs`` are CPU tensors (or anything else, passed as is); the xla side
    gets copies moved to the device. An ``nn.Module`` ``fn`` is deep-copied to the
    device for the xla side; any other ``fn`` must use its arguments' device. The xla
    side may compute in another dtype or precision: ``xla_dtype=torch.bfloat16`` casts
    its floating inputs and module (or use autocast inside ``fn``); errors are measured
    in float64. Returns a CompareReport; ``.first_divergence`` is
    the first op beyond ``atol + rtol * |cpu|``, or None."""
    __debuggerskip__ = True  # IPython's debugger steps over xlanb frames

    def to_xla(v):
        if isinstance(v, torch.nn.Module):  # a model passed as an argument: its own copy
            m = copy.deepcopy(v).to("xla")
            return m.to(xla_dtype) if xla_dtype is not None else m
        return v.detach().clone().to("xla", xla_dtype).requires_grad_(v.requires_grad) \
            if isinstance(v, torch.Tensor) and v.is_floating_point() else \
            (v.to("xla") if isinstance(v, torch.Tensor) else v)

    def to_cpu(v):
        if isinstance(v, torch.nn.Module):
            return copy.deepcopy(v)
        return v.detach().clone().requires_grad_(v.requires_grad) \
            if isinstance(v, torch.Tensor) and v.is_floating_point() else v

    fn_cpu, fn_xla = fn, fn
    if isinstance(fn, torch.nn.Module):
        fn_cpu = copy.deepcopy(fn)
        fn_xla = copy.deepcopy(fn).to("xla")
        if xla_dtype is not None:
            fn_xla = fn_xla.to(xla_dtype)
    cargs, ckw = tree_map(to_cpu, (args, kwargs))
    cpu = _Record(xla=False)
    with cpu:
        fn_cpu(*cargs, **ckw)
    xargs, xkw = tree_map(to_xla, (args, kwargs))
    prev_mode, prev_bg = get_mode(), config.background_compile
    set_mode("eager")
    config.background_compile = False  # every op runs now: its snapshot holds data
    xla = _Record(xla=True)
    try:
        with xla:
            fn_xla(*xargs, **xkw)
    finally:
        config.background_compile = prev_bg
        set_mode(prev_mode)
    return _report(cpu.ops, xla.ops, rtol, atol, xla.summary())


def _report(cpu_ops, xla_ops, rtol, atol, graph=None) -> CompareReport:
    sm = difflib.SequenceMatcher(a=[o[0] for o in cpu_ops], b=[o[0] for o in xla_ops],
                                 autojunk=False)
    rows = []
    row_of_op: dict = {}  # xla op index -> its row

    def only(op, side):
        name, src, scope, snaps = op
        rows.append(CompareRow(len(rows), name, scope, src, (), "", float("nan"),
                               float("nan"), True, f"only on {side}"))

    i = j = 0
    for a, b, n in sm.get_matching_blocks():
        for k in range(i, a):
            only(cpu_ops[k], "cpu")
        for k in range(j, b):
            row_of_op[k] = len(rows)
            only(xla_ops[k], "xla")
        for k in range(n):
            c_op, x_op = cpu_ops[a + k], xla_ops[b + k]
            name, src, scope, xs = x_op
            max_abs = max_rel = 0.0
            ok, note = True, ""
            shape, dtype = (), ""
            for xs_i, cs_i in zip(xs, c_op[3]):
                xa, ca = _host(xs_i), _host(cs_i)
                shape, dtype = tuple(xa.shape), str(xs_i[1]).replace("torch.", "")
                e_abs, e_rel, e_ok, e_note = _errors(xa, ca, rtol, atol)
                max_abs = max(max_abs, e_abs) if e_abs == e_abs else e_abs
                max_rel = max(max_rel, e_rel) if e_rel == e_rel else e_rel
                ok = ok and e_ok
                note = note or e_note
            row_of_op[b + k] = len(rows)
            rows.append(CompareRow(len(rows), name, scope, src or c_op[1], shape, dtype,
                                   max_abs, max_rel, ok, note))
        i, j = a + n, b + n
    return CompareReport(rows, rtol, atol, graph, row_of_op)


__all__ = ["compare_cpu", "CompareReport", "CompareRow"]
