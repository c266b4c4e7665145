"""Why did a graph recompile? Compare it with the previous graph from the same place.

A graph's ``GraphSummary`` (summary.py) lists its inputs' shapes and, per op, the op
name, result type and user source line. ``diff_summaries`` matches the nodes of two
graphs (inputs by type, ops by name, as ``difflib`` matches two sequences) and marks
each one that differs; ``explain`` says in a line (or a few) what differs first, on the
same matching. Both name source lines through ``label`` (default ``SourceLoc.short``).
"""
from __future__ import annotations

import difflib
import re
from typing import Callable, NamedTuple

from ..base.frames import SourceLoc, format_loc
from .summary import GraphSummary, OpRecord

Label = Callable[[SourceLoc], str]


def _blocks(a: list, b: list) -> list[tuple]:
    """``difflib`` opcodes (tag, i1, i2, j1, j2) matching two sequences."""
    return difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes()


def _where(op: OpRecord, label: Label) -> str:
    return f" at {label(op.src)}" if op.src else ""


def _unwired(static: str) -> str:
    """An op's static arguments without its input references (``%3``): positions shift
    from graph to graph, and the inputs are compared on their own."""
    return re.sub(r"%\d+", "%", static)


class SummaryDiff(NamedTuple):
    """How graph ``b`` differs from graph ``a``, node by node."""
    a: dict      # position in a -> "changed" | "follows" | "removed"
    b: dict      # position in b -> "changed" | "follows" | "added"
    lines: list  # one readable line per difference
    pairs: dict  # matched positions: a -> b
    op_blocks: list  # difflib opcodes over the two graphs' op names


def diff_summaries(a: GraphSummary, b: GraphSummary, label: Label = format_loc) -> SummaryDiff:
    """Match the nodes of two graphs and say which differ.

    Inputs are matched by their types, ops by their names (``difflib`` on the op
    sequences). A matched op whose result type, static arguments or inputs differ is
    "changed", or "follows" when that is only because one of its inputs differs (a
    consequence, not a cause); unmatched ops are "removed" (only in ``a``) or "added"
    (only in ``b``).
    """
    na, nb = len(a.inputs), len(b.inputs)
    sa: dict[int, str] = {}
    sb: dict[int, str] = {}
    lines: list[str] = []
    pairs: dict[int, int] = {}

    for tag, i1, i2, j1, j2 in _blocks(list(a.inputs), list(b.inputs)):
        if tag == "equal":
            pairs.update({i1 + k: j1 + k for k in range(i2 - i1)})
            continue
        common = min(i2 - i1, j2 - j1) if tag == "replace" else 0
        for k in range(common):
            pairs[i1 + k] = j1 + k
            sa[i1 + k] = sb[j1 + k] = "changed"
            lines.append(f"input %{j1 + k}: {a.inputs[i1 + k]} -> {b.inputs[j1 + k]}")
        for i in range(i1 + common, i2):
            sa[i] = "removed"
            lines.append(f"input %{i} {a.inputs[i]} is gone")
        for j in range(j1 + common, j2):
            sb[j] = "added"
            lines.append(f"new input %{j} {b.inputs[j]}")

    op_blocks = _blocks([o.name for o in a.ops], [o.name for o in b.ops])
    for tag, i1, i2, j1, j2 in op_blocks:
        if tag == "equal":
            pairs.update({na + i1 + k: nb + j1 + k for k in range(i2 - i1)})
            continue
        for i in range(i1, i2):
            sa[na + i] = "removed"
        for j in range(j1, j2):
            sb[nb + j] = "added"
        if i2 > i1:
            op = a.ops[i1]
            lines.append(f"{i2 - i1} op(s) only in the old graph, first %{na + i1} "
                         f"{op.name}{_where(op, label)}")
        if j2 > j1:
            op = b.ops[j1]
            lines.append(f"{j2 - j1} op(s) only in the new graph, first %{nb + j1} "
                         f"{op.name}{_where(op, label)}")

    followers: list[str] = []
    for pa, pb in pairs.items():
        if pa < na:
            continue
        oa, ob = a.ops[pa - na], b.ops[pb - nb]
        why = []
        if oa.aval != ob.aval:
            why.append(f"{oa.aval} -> {ob.aval}")
        same_static = _unwired(oa.static) == _unwired(ob.static)
        if not same_static:
            why.append(f"arguments ({oa.static}) -> ({ob.static})")
        if why or tuple(pairs.get(q, -1 - q) for q in oa.ins) != tuple(ob.ins):
            if same_static and any(sb.get(q) in ("changed", "follows", "added")
                                   for q in ob.ins):
                sa[pa] = sb[pb] = "follows"  # its inputs changed: a consequence
                followers.append(f"%{pb} {ob.name}")
                continue
            sa[pa] = sb[pb] = "changed"
            lines.append(f"%{pb} {ob.name}{_where(ob, label)}: "
                         + ("; ".join(why) or "different inputs"))
    if followers:
        n = len(followers)
        lines.append(f"{n} op{'s' * (n != 1)} downstream changed with them: "
                     + ", ".join(followers[:6]) + (" ..." if n > 6 else ""))
    outs_a = {pairs.get(p, -1 - p) for p in a.outputs}
    if outs_a != set(b.outputs):
        lines.append(f"outputs: {len(a.outputs)} -> {len(b.outputs)} live tensors")
    return SummaryDiff(sa, sb, lines, pairs, op_blocks)


def _core(text):
    """A sharding's text without where it was marked (that alone compiles nothing)."""
    return text.split(" (marked at")[0] if text else text


class _Recompile:
    """How ``explain`` words a difference: a graph against the previous one from its
    place (a recompile)."""

    def header(self, n_a, n_b):
        return f"graph changed ({n_a} -> {n_b} ops): "

    def shape(self, op, where, a, b):
        return f"shape change: {op}{where}: {a} -> {b}"

    def input(self, i, a, b):
        return f"input %{i} changed: {a} -> {b}"

    def inputs(self, n_a, n_b):
        return f"inputs changed: {n_a} -> {n_b} inputs"

    def sharding(self, i, aval, a, b):
        return f"sharding changed: input %{i} {aval}: {a} -> {b}"

    def static(self, op, where, a, b):
        return f"static arguments of {op}{where}: ({b}) now, ({a}) before"

    def outputs(self, n_a, n_b):
        return f"outputs changed: {n_a} -> {n_b} live tensors"

    def added(self, n, op):
        return f"{n} op(s) added, first {op}"

    def removed(self, n, op):
        return f"{n} op(s) removed, first {op}"

    def replaced(self, b, a):
        return f"{b} where the previous graph had {a}"


class _Sides(_Recompile):
    """The same differences between two processes' graphs of one run (``a``, ``b``:
    "process 0", "process 1"): neither is the newer."""

    def __init__(self, a: str, b: str):
        self.a, self.b = a, b

    def header(self, n_a, n_b):
        return f"the graphs differ ({n_a} ops in {self.a}, {n_b} in {self.b}): "

    def shape(self, op, where, a, b):
        return f"shapes differ: {op}{where}: {a} in {self.a}, {b} in {self.b}"

    def input(self, i, a, b):
        return f"input %{i} differs: {a} in {self.a}, {b} in {self.b}"

    def inputs(self, n_a, n_b):
        return f"inputs differ: {n_a} in {self.a}, {n_b} in {self.b}"

    def sharding(self, i, aval, a, b):
        return f"shardings differ: input %{i} {aval}: {a} in {self.a}, {b} in {self.b}"

    def static(self, op, where, a, b):
        return f"static arguments of {op}{where}: ({a}) in {self.a}, ({b}) in {self.b}"

    def outputs(self, n_a, n_b):
        return f"outputs differ: {n_a} live tensors in {self.a}, {n_b} in {self.b}"

    def added(self, n, op):
        return f"{n} op(s) only in {self.b}, first {op}"

    def removed(self, n, op):
        return f"{n} op(s) only in {self.a}, first {op}"

    def replaced(self, b, a):
        return f"{b} in {self.b} where {self.a} has {a}"


def explain(prev: GraphSummary, new: GraphSummary, label: Label = format_loc,
            sides: tuple[str, str] | None = None) -> str:
    """One line (or a few) saying how ``new`` differs from ``prev``: the first thing
    that differs (an op's result shape, an input, static arguments, an op added or
    removed) and the source line it came from. ``sides``: the two graphs are the same
    run in two processes (``("process 0", "process 1")``), worded so, not as a recompile."""
    w = _Sides(*sides) if sides else _Recompile()
    d = diff_summaries(prev, new, label)
    reasons: list[str] = []
    if all(tag == "equal" for tag, *_ in d.op_blocks):  # the same ops, in order
        for a, b in zip(prev.ops, new.ops):
            if a.aval != b.aval:
                reasons.append(w.shape(b.name, _where(b, label), a.aval, b.aval))
                break
        if not reasons and prev.inputs != new.inputs:
            for i, (a, b) in enumerate(zip(prev.inputs, new.inputs)):
                if a != b:
                    reasons.append(w.input(i, a, b))
                    break
            else:
                reasons.append(w.inputs(len(prev.inputs), len(new.inputs)))
        if not reasons:  # SPMD: the same graph over inputs sharded otherwise
            sa = {p: t for p, t in prev.shardings if p < len(prev.inputs)}
            sb = {p: t for p, t in new.shardings if p < len(new.inputs)}
            for i in range(len(new.inputs)):
                if _core(sa.get(i)) != _core(sb.get(i)):
                    reasons.append(w.sharding(i, new.inputs[i], sa.get(i) or 'unsharded',
                                              sb.get(i) or 'unsharded'))
                    break
        if not reasons:
            for a, b in zip(prev.ops, new.ops):
                if a.static != b.static:
                    reasons.append(w.static(b.name, _where(b, label), a.static, b.static))
                    break
        if not reasons and prev.outputs != new.outputs:
            reasons.append(w.outputs(len(prev.outputs), len(new.outputs)))
        if not reasons:
            reasons.append("same ops, shapes and arguments; the wiring between ops differs")
        return "; ".join(reasons)
    for tag, i1, i2, j1, j2 in d.op_blocks:
        if tag == "equal":
            continue
        if tag == "insert":
            op = new.ops[j1]
            reasons.append(w.added(j2 - j1, f"{op.name}{_where(op, label)}"))
        elif tag == "delete":
            op = prev.ops[i1]
            reasons.append(w.removed(i2 - i1, f"{op.name}{_where(op, label)}"))
        else:
            a, b = prev.ops[i1], new.ops[j1]
            reasons.append(w.replaced(f"{b.name}{_where(b, label)}", f"{a.name}{_where(a, label)}"))
        if len(reasons) == 2:
            break
    return w.header(len(prev.ops), len(new.ops)) + "; ".join(reasons)
