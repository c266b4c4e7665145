"""Why did a graph recompile? Compare it with the previous graph from the same place.

A graph's ``GraphSummary`` (summary.py) lists its inputs' shapes and, per op, the op
name, result type and user source line. The explanation names the first thing that
differs (an input shape, an op's result shape, an op added or removed) and the source
line it came from.
"""
from __future__ import annotations

import difflib

from .summary import GraphSummary, OpRecord


def _where(op: OpRecord) -> str:
    return f" at {op.src.short}" if op.src else ""


def explain(prev: GraphSummary, new: GraphSummary) -> str:
    """One line (or a few) saying how ``new`` differs from ``prev``."""
    old_names = [o.name for o in prev.ops]
    new_names = [o.name for o in new.ops]
    reasons: list[str] = []
    if old_names == new_names:
        for a, b in zip(prev.ops, new.ops):
            if a.aval != b.aval:
                reasons.append(f"shape change: {b.name}{_where(b)}: {a.aval} -> {b.aval}")
                break
        if not reasons and prev.inputs != new.inputs:
            for i, (a, b) in enumerate(zip(prev.inputs, new.inputs)):
                if a != b:
                    reasons.append(f"input %{i} changed: {a} -> {b}")
                    break
            else:
                reasons.append(f"inputs changed: {len(prev.inputs)} -> {len(new.inputs)} inputs")
        if not reasons:
            for a, b in zip(prev.ops, new.ops):
                if a.static != b.static:
                    reasons.append(f"static arguments of {b.name}{_where(b)}: "
                                   f"({b.static}) now, ({a.static}) before")
                    break
        if not reasons and prev.outputs != new.outputs:
            reasons.append(f"outputs changed: {len(prev.outputs)} -> {len(new.outputs)} live tensors")
        if not reasons:
            reasons.append("same ops, shapes and arguments; the wiring between ops differs")
        return "; ".join(reasons)
    matcher = difflib.SequenceMatcher(a=old_names, b=new_names, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        if tag == "insert":
            op = new.ops[j1]
            reasons.append(f"{j2 - j1} op(s) added, first {op.name}{_where(op)}")
        elif tag == "delete":
            op = prev.ops[i1]
            reasons.append(f"{i2 - i1} op(s) removed, first {op.name}{_where(op)}")
        else:
            a, b = prev.ops[i1], new.ops[j1]
            reasons.append(f"{b.name}{_where(b)} where the previous graph had {a.name}{_where(a)}")
        if len(reasons) == 2:
            break
    return f"graph changed ({len(old_names)} -> {len(new_names)} ops): " + "; ".join(reasons)
